"""The kernel itself dies, in each phase: nothing distnb started outlives it.

A real Jupyter kernel (jupyter_client) runs `%dist_start`; the kernel is then killed while the
cluster starts, while a rank waits at a collective, after its reaper was killed and replaced,
and in the middle of `%dist_stop`. Every process that carried the cluster's mark and every
shared-memory board of the session must be gone within seconds. (A kernel killed while idle
is in tests/test_kernel.py.)
"""

from __future__ import annotations

import glob
import json
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import psutil
import pytest

from distnb.reaper import MARK_VAR, marked
from distnb.session.control import boards_pattern
from harness.processes import plain, running_pids
from tests.test_kernel import kernel

__all__ = ["kernel"]  # the fixture: a real kernel, shut down after the test

pytestmark = pytest.mark.cluster

GONE_S = 10.0  # for everything to be gone after the kernel's death
START = "%load_ext distnb\n%dist_start -n 2"
SESSION = (
    "import json; from distnb.magics import DistMagics\n"
    "m = next(m for m in get_ipython().magics_manager.registry.values()"
    " if isinstance(m, DistMagics))\n"
    "print(json.dumps([m.session.control.session_id, m.session.cluster._reaper.pid]))"
)


def run(kc: Any, code: str, timeout: float = 120, ok: bool = True) -> str:
    """Run `code` to its end; return its output and traceback text (asserting it did not
    fail, or that it did when not `ok`)."""
    out: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        content = msg["content"]
        text = content.get("data", {}).get("text/plain", "") or content.get("text", "")
        out.append(text or "\n".join(content.get("traceback", [])))

    reply = kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    assert (reply["content"]["status"] == "ok") == ok, "".join(out)
    return plain("".join(out))


def tree(pid: int) -> list[psutil.Process]:
    with_children = [psutil.Process(pid)]
    try:
        return with_children + with_children[0].children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def command(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def mark_of(procs: list[psutil.Process]) -> str:
    for proc in procs:
        try:
            env = proc.environ()
        except psutil.Error:
            continue
        if MARK_VAR in env:
            return env[MARK_VAR]
    raise AssertionError("no process of the cluster carries distnb's mark")


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def snapshot(kernel_pid: int) -> tuple[list[int], str]:
    """The kernel and every process below it now, and the mark of its cluster's processes."""
    procs = tree(kernel_pid)
    return [p.pid for p in procs], mark_of(procs)


def kill_and_check(kernel_pid: int, sig: int, boards: str = "") -> None:
    """Kill the kernel with `sig`: every process it had, marked or not, and its boards go."""
    pids, mark = snapshot(kernel_pid)
    os.kill(kernel_pid, sig)
    assert_all_gone(pids, mark, boards)


def assert_all_gone(pids: list[int], mark: str, boards: str = "") -> None:
    deadline = time.monotonic() + GONE_S
    while (running_pids(pids) or marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not running_pids(pids), [command(psutil.Process(p)) for p in running_pids(pids)]
    assert not marked(mark)
    if boards:
        assert not glob.glob(boards)


def test_a_kernel_killed_while_the_cluster_starts(kernel: tuple[Any, Any]) -> None:
    km, kc = kernel
    kernel_pid = km.provisioner.pid
    kc.execute(START)

    def controller_forked() -> bool:
        # the controller's heart monitor: the child the reaper could not be told about before
        controllers = [p for p in tree(kernel_pid) if "ipyparallel.controller" in command(p)]
        return any(p.ppid() in {c.pid for c in controllers} for p in controllers)

    wait_for(controller_forked, "the controller's heart monitor")
    kill_and_check(kernel_pid, signal.SIGKILL)


def test_a_kernel_killed_while_a_rank_waits_at_a_collective(kernel: tuple[Any, Any]) -> None:
    km, kc = kernel
    kernel_pid = km.provisioner.pid
    run(kc, START)
    session_id, _ = json.loads(run(kc, SESSION).strip().splitlines()[-1])
    boards = boards_pattern(session_id)
    before = set(glob.glob(boards))
    # A group of its own: its board is made by rank 0's first call and unlinked only once
    # rank 1 has mapped it too, which it never does here.
    kc.execute(
        "%%allranks\nimport time\ng = dist.new_group([0, 1])\nx = torch.ones(1)\n"
        "if rank == 1:\n    time.sleep(60)\ndist.all_reduce(x, group=g)"
    )
    wait_for(lambda: bool(set(glob.glob(boards)) - before), "rank 0's board in /dev/shm")
    kill_and_check(kernel_pid, signal.SIGKILL, boards)


def test_a_rank_dies_in_a_kernel_then_the_kernel_is_terminated(kernel: tuple[Any, Any]) -> None:
    """In a kernel (whose event loop runs ipyparallel's callbacks) a rank's death is reported
    whole; the reaper is killed and replaced; the kernel's SIGTERM leaves nothing behind."""
    km, kc = kernel
    kernel_pid = km.provisioner.pid
    run(kc, START)
    _, reaper = json.loads(run(kc, SESSION).strip().splitlines()[-1])
    os.kill(reaper, signal.SIGKILL)

    def replaced() -> bool:
        reapers = [p for p in tree(kernel_pid) if "distnb.reaper" in command(p)]
        return any(p.pid != reaper and p.status() != psutil.STATUS_ZOMBIE for p in reapers)

    wait_for(replaced, "a new reaper", timeout=10)
    run(kc, "%%allranks\nprint('an earlier cell')")
    died = run(kc, "%%allranks\nimport os\nprint('bye')\nif rank == 1:\n    os.abort()", ok=False)
    assert "RankDiedError: rank 1 (pid" in died and "was killed by SIGABRT in cell In[" in died
    # line 5 of the cell: the notebook counts its %%allranks line too
    assert "at line 5: os.abort()\n  its last output:\n    bye\n" in died
    assert "an earlier cell" not in died.split("RankDiedError")[1]
    # ipykernel leaves SIGTERM to Python's default: the kernel ends at once, no atexit
    kill_and_check(kernel_pid, signal.SIGTERM)


def test_a_kernel_killed_in_the_middle_of_dist_stop(kernel: tuple[Any, Any]) -> None:
    km, kc = kernel
    kernel_pid = km.provisioner.pid
    run(kc, START)
    pids, mark = snapshot(kernel_pid)
    # the kernel dies right after stop's first SIGKILL: the rest is the reaper's
    kc.execute(
        "import os, signal\nimport distnb.session.cluster.processes as p\nsend = p.send\n"
        "def dying(proc, sig):\n    send(proc, sig)\n    os.kill(os.getpid(), signal.SIGKILL)\n"
        "p.send = dying\n%dist_stop"
    )
    assert_all_gone(pids, mark)
