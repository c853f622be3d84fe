"""distnb inside a real Jupyter kernel: live output, Ctrl-C, and nothing left after shutdown."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from tests.conftest import plain, running

pytestmark = pytest.mark.cluster

PIDS = (
    "import json; from distnb.magics import DistMagics\n"
    "registry = get_ipython().magics_manager.registry\n"
    "m = next(m for m in registry.values() if isinstance(m, DistMagics))\n"
    "print(json.dumps(m.session.pids()))"
)


@pytest.fixture
def kernel() -> Iterator[tuple[Any, Any]]:
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    yield km, kc
    kc.stop_channels()
    if km.is_alive():
        km.shutdown_kernel(now=True)


def execute(kc: Any, code: str, timeout: float = 60) -> tuple[str, list[dict[str, Any]]]:
    """Run `code`; return its reply status and every output message's content (the reply's
    execution count last, as `{"type": "reply", ...}`)."""
    msg_id = kc.execute(code)
    outputs = []
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind = msg["msg_type"]
        if kind == "status" and msg["content"]["execution_state"] == "idle":
            break
        if kind in ("stream", "display_data", "update_display_data", "execute_result", "error"):
            outputs.append({"type": kind, **msg["content"]})
    reply = kc.get_shell_msg(timeout=timeout)
    outputs.append({"type": "reply", **reply["content"]})
    return reply["content"]["status"], outputs


def text_of(outputs: list[dict[str, Any]]) -> str:
    parts = []
    for out in outputs:
        if out["type"] == "stream":
            parts.append(out["text"])
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
        elif out["type"] == "error":
            parts.append("\n".join(out["traceback"]))
    return plain("\n".join(parts))


def test_a_killed_kernel_takes_its_ranks_along(kernel: tuple[Any, Any]) -> None:
    km, kc = kernel
    status, outputs = execute(kc, "%load_ext distnb\n%dist_start -n 2")
    assert status == "ok", text_of(outputs)
    _, outputs = execute(kc, PIDS)
    pids = json.loads(text_of(outputs).strip().splitlines()[-1])
    assert len(pids) >= 6  # controller, 2 engines, 2 nannies, the reaper
    os.kill(km.provisioner.pid, signal.SIGKILL)  # no atexit, no %dist_stop
    deadline = time.monotonic() + 10
    while running(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(pids)


def test_kernel_runs_cells_survives_interrupt_and_cleans_up(kernel: tuple[Any, Any]) -> None:
    km, kc = kernel
    status, outputs = execute(kc, "%load_ext distnb\n%dist_start -n 2")
    assert status == "ok", text_of(outputs)
    status, outputs = execute(
        kc, "%%allranks\nx = torch.ones(2) * rank\ndist.all_reduce(x)\nprint(rank, x.tolist())"
    )
    assert status == "ok"
    # live areas: one per rank, created in rank order and updated in place
    assert [o["type"] for o in outputs].count("display_data") == 2
    final = {
        o["transient"]["display_id"]: o["data"]["text/plain"] for o in outputs if "transient" in o
    }
    shown = "\n".join(text for text in final.values() if text)
    assert shown == "[rank 0] 0 [1.0, 1.0]\n[rank 1] 1 [1.0, 1.0]"

    # errors name the cell as the notebook numbers it, and its line counting the magic's line
    status, outputs = execute(kc, "%%allranks\nx = 1\nraise KeyError(rank)")
    count = outputs[-1]["execution_count"]
    assert status == "error"
    assert f"cell In[{count}] failed" in text_of(outputs)
    assert f"Cell In[{count}], line 3" in text_of(outputs)

    # a collective mismatch is also shown as a table, one row per rank
    code = "%%allranks\nx = torch.zeros(1, 5) if rank == 0 else torch.zeros(1, 2, 5)\n"
    status, outputs = execute(kc, code + "dist.broadcast(x, src=0)")
    tables = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert status == "error" and outputs[-1]["ename"] == "CollectiveMismatchError"
    assert len(tables) == 1 and "<table" in tables[0] and "float32[1, 2, 5]" in tables[0]

    _, outputs = execute(kc, PIDS)
    pids = json.loads(text_of(outputs).strip().splitlines()[-1])

    msg_id = kc.execute("%%allranks\nimport time\nprint('sleeping', flush=True)\ntime.sleep(60)")
    while True:  # wait until both ranks report they sleep
        msg = kc.get_iopub_msg(timeout=30)
        data = msg["content"].get("data", {}).get("text/plain", "")
        if msg["parent_header"].get("msg_id") == msg_id and "[rank 1] sleeping" in data:
            break
    started = time.monotonic()
    km.interrupt_kernel()
    reply = kc.get_shell_msg(timeout=30)
    assert (
        reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
    )
    assert time.monotonic() - started < 10

    status, outputs = execute(kc, "%%allranks\nprint('alive', rank)")
    assert status == "ok" and "[rank 1] alive 1" in text_of(outputs)

    kernel_pid = km.provisioner.pid
    km.shutdown_kernel(now=False)
    psutil.wait_procs([psutil.Process(p) for p in running([kernel_pid])], timeout=10)
    deadline = time.monotonic() + 5
    while running(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running([kernel_pid, *pids])
