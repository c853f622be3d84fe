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

from tests import kernel_driver
from tests.conftest import running
from tests.kernel_driver import execute

pytestmark = pytest.mark.cluster

PIDS = (
    "import json; from distnb.magics import DistMagics\n"
    "registry = get_ipython().magics_manager.registry\n"
    "m = next(m for m in registry.values() if isinstance(m, DistMagics))\n"
    "print(json.dumps(m.session.pids()))"
)


@pytest.fixture
def kernel() -> Iterator[tuple[Any, Any]]:
    with kernel_driver.kernel() as (km, kc):
        yield km, kc


def test_a_killed_kernel_takes_its_ranks_along(kernel: tuple[Any, Any]) -> None:
    km, kc = kernel
    started = execute(kc, "%load_ext distnb\n%dist_start -n 2")
    assert started.status == "ok", started.text
    pids = json.loads(execute(kc, PIDS).text.strip().splitlines()[-1])
    assert len(pids) >= 6  # controller, 2 engines, 2 nannies, the reaper
    os.kill(km.provisioner.pid, signal.SIGKILL)  # no atexit, no %dist_stop
    deadline = time.monotonic() + 10
    while running(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(pids)


def test_kernel_runs_cells_survives_interrupt_and_cleans_up(kernel: tuple[Any, Any]) -> None:
    km, kc = kernel
    started = execute(kc, "%load_ext distnb\n%dist_start -n 2")
    assert started.status == "ok", started.text
    ran = execute(
        kc, "%%allranks\nx = torch.ones(2) * rank\ndist.all_reduce(x)\nprint(rank, x.tolist())"
    )
    assert ran.status == "ok"
    # live areas: one per rank, created in rank order and updated in place
    assert len(ran.of_type("display_data")) == 2
    final = {
        o["transient"]["display_id"]: o["data"]["text/plain"]
        for o in ran.of_type("display_data", "update_display_data")
        if "transient" in o
    }
    shown = "\n".join(text for text in final.values() if text)
    assert shown == "[rank 0] 0 [1.0, 1.0]\n[rank 1] 1 [1.0, 1.0]"

    # errors name the cell as the notebook numbers it, and its line counting the magic's line
    failed = execute(kc, "%%allranks\nx = 1\nraise KeyError(rank)")
    count = failed.reply["execution_count"]
    assert failed.status == "error"
    assert f"cell In[{count}] failed" in failed.text
    assert f"Cell In[{count}], line 3" in failed.text

    # a collective mismatch is also shown as a table, one row per rank
    code = "%%allranks\nx = torch.zeros(1, 5) if rank == 0 else torch.zeros(1, 2, 5)\n"
    mismatch = execute(kc, code + "dist.broadcast(x, src=0)")
    tables = [m["data"]["text/html"] for m in mismatch.messages if "text/html" in m.get("data", {})]
    assert mismatch.status == "error" and mismatch.reply["ename"] == "CollectiveMismatchError"
    assert len(tables) == 1 and "<table" in tables[0] and "float32[1, 2, 5]" in tables[0]

    pids = json.loads(execute(kc, PIDS).text.strip().splitlines()[-1])

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

    alive = execute(kc, "%%allranks\nprint('alive', rank)")
    assert alive.status == "ok" and "[rank 1] alive 1" in alive.text

    kernel_pid = km.provisioner.pid
    km.shutdown_kernel(now=False)
    psutil.wait_procs([psutil.Process(p) for p in running([kernel_pid])], timeout=10)
    deadline = time.monotonic() + 5
    while running(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running([kernel_pid, *pids])
