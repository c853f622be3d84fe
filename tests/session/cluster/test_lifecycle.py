"""Starting, stopping, restarting and losing ranks, on real clusters of their own."""

from __future__ import annotations

import os
import time

import pytest

import distnb
from distnb.errors import RankDiedError, SessionError
from harness.processes import NAMED_S, running_pids

pytestmark = pytest.mark.cluster


def test_stop_leaves_no_process_and_restart_works(capsys: pytest.CaptureFixture[str]) -> None:
    with distnb.start(2, progress=False) as s:
        first = s.pids()
        assert len(first) >= 5  # controller, 2 engines, 2 nannies
        status = repr(s.status())
        assert "rank  host" in status and "gloo" in status
        s.restart()
        second = s.pids()
        assert not running_pids(first)
        s.run("print('back', rank)")
        assert "[rank 1] back 1" in capsys.readouterr().out
    assert not running_pids(second)
    assert "no cluster running" in repr(s.status())
    with pytest.raises(SessionError, match="%dist_start"):
        s.run("pass")


@pytest.mark.parametrize(
    ("code", "how"),
    [
        ("import os\nif rank == 1:\n    os._exit(3)\n", "exited with code 3"),
        (
            "import os, signal\nif rank == 1:\n    os.kill(os.getpid(), signal.SIGKILL)\n",
            "killed by SIGKILL",
        ),
    ],
)
def test_a_dying_rank_is_named_at_once_and_restart_recovers(code: str, how: str) -> None:
    with distnb.start(2, progress=False) as s:
        started = time.monotonic()
        with pytest.raises(RankDiedError) as info:
            s.run(code + "import time\ntime.sleep(30)\n")
        assert time.monotonic() - started < NAMED_S  # named, not the cell's 30 s sleep
        message = str(info.value)
        assert f"rank 1 (pid {s.ranks[1].pid}" in message and how in message
        assert "%dist_restart" in message
        with pytest.raises(SessionError, match="dist_restart"):
            s.run("pass")
        s.restart()
        result = s.run("x = torch.ones(1)\ndist.all_reduce(x)\nx.item()")
        assert result.result(1) == "2.0"


def test_the_process_tree_is_read_in_one_look_as_psutil_reads_it() -> None:
    """`processes.descendants` (one look at the process table for every launcher) finds what
    psutil's `children(recursive=True)` finds, each parent before its children."""
    import subprocess
    import sys

    import psutil

    from distnb.session.cluster.processes import descendants

    sleeper = "import time; time.sleep(60)"
    parent = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {sleeper!r}])\ntime.sleep(60)"
    )
    top = subprocess.Popen([sys.executable, "-c", parent])
    try:
        deadline = time.monotonic() + 60
        while len(psutil.Process(top.pid).children(recursive=True)) < 1:
            assert time.monotonic() < deadline, "the child did not start"
            time.sleep(0.01)
        found = descendants([top.pid, os.getpid()])
        assert [p.pid for p in found[top.pid]] == [
            p.pid for p in psutil.Process(top.pid).children(recursive=True)
        ]
        mine = [p.pid for p in found[os.getpid()]]
        assert top.pid in mine and found[top.pid][0].pid in mine
        assert mine.index(top.pid) < mine.index(found[top.pid][0].pid)
    finally:
        for p in psutil.Process(top.pid).children(recursive=True):
            p.kill()
        top.kill()
        top.wait()
