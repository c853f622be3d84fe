"""Telling an OOM kill from another SIGKILL: the pure weighing, the kernel log's words, and a
real OOM kill in a memory cgroup of its own (where this host lets a test make one)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distnb.session.cluster.oom import (
    OomBaseline,
    OomEvidence,
    killed_pids,
    memory_cgroup,
    oom_killed,
    read_oom_kills,
)

KILL = -signal.SIGKILL


@pytest.mark.parametrize(
    ("code", "before", "after", "expected"),
    [
        (KILL, OomEvidence(0), OomEvidence(1), True),  # the cgroup's count went up
        (KILL, OomEvidence(1), OomEvidence(1), False),  # killed by someone else
        (KILL, OomEvidence(), OomEvidence(None, frozenset({7})), True),  # the log names it
        (None, OomEvidence(), OomEvidence(None, frozenset({7})), True),  # status unknown
        (None, OomEvidence(0), OomEvidence(1), False),  # a count alone needs the SIGKILL
        (1, OomEvidence(0), OomEvidence(1, frozenset({7})), False),  # it exited by itself
        (-signal.SIGABRT, OomEvidence(0), OomEvidence(1), False),
        (KILL, OomEvidence(None), OomEvidence(3), False),  # nothing to compare with
    ],
)
def test_oom_killed_weighs_the_evidence(
    code: int | None, before: OomEvidence, after: OomEvidence, expected: bool
) -> None:
    assert oom_killed(7, code, before, after) is expected


def test_kernel_log_lines_name_the_killed_pids() -> None:
    lines = [
        "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
        "oom_memcg=/a,task_memcg=/a,task=python,pid=4282,uid=0",
        "Memory cgroup out of memory: Killed process 4282 (python) total-vm:422116kB",
        "Out of memory: Killed process 99 (java) total-vm:1kB",
        "usb 1-1: new device",
    ]
    assert killed_pids(lines) == {4282, 99}


def test_counts_are_read_from_either_cgroup_version_or_left_unknown(tmp_path: Path) -> None:
    v2, v1, neither = tmp_path / "v2", tmp_path / "v1", tmp_path / "neither"
    for d in (v2, v1, neither):
        d.mkdir()
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 4\noom_kill 3\n")
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    (neither / "memory.events").write_text("low 0\nhigh 0\n")  # no oom_kill line
    assert read_oom_kills(str(v2)) == 3
    assert read_oom_kills(str(v1)) == 5
    assert read_oom_kills(str(neither)) is None
    assert read_oom_kills(str(tmp_path / "missing")) is None
    assert read_oom_kills(None) is None


def test_memory_cgroup_is_the_one_this_process_is_in() -> None:
    assert memory_cgroup(2**22 + 12345) is None  # no such process
    if not Path("/sys/fs/cgroup").is_dir():
        pytest.skip("needs Linux's cgroup filesystem at /sys/fs/cgroup")
    cgroup = memory_cgroup(os.getpid())
    assert cgroup is not None
    assert str(os.getpid()) in (Path(cgroup) / "cgroup.procs").read_text().split()


def test_a_real_oom_kill_is_named_and_a_plain_sigkill_is_not(small_cgroup: Path) -> None:
    code = (
        "import sys, time\n"
        "open(sys.argv[1], 'w').write(str(__import__('os').getpid()))\n"
        "time.sleep(0.3)\n"
        "hog = bytearray(400 * 2**20)\n"
    )
    hog = subprocess.Popen([sys.executable, "-c", code, str(small_cgroup / "cgroup.procs")])
    procs = small_cgroup / "cgroup.procs"
    while str(hog.pid) not in procs.read_text().split():  # it moves itself, then waits
        time.sleep(0.01)
    watch = OomBaseline([hog.pid])
    assert hog.wait(30) == KILL
    assert watch.killed(hog.pid, KILL)

    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    plain = OomBaseline([idle.pid])
    idle.kill()
    assert idle.wait(10) == KILL
    assert not plain.killed(idle.pid, KILL)


def test_the_oom_killer_is_named_only_on_evidence(monkeypatch: pytest.MonkeyPatch) -> None:
    from distnb.session.cluster import oom
    from distnb.session.cluster.members import exit_text

    assert exit_text(3) == "exited with code 3"
    assert exit_text(KILL) == "was killed by SIGKILL"
    # the kernel log is the evidence a baseline of no cgroups has: it decides, either way
    monkeypatch.setattr(oom, "kernel_log", lambda: ["Out of memory: Killed process 8 (python)"])
    assert not OomBaseline([]).killed(7, KILL)
    assert OomBaseline([]).killed(8, KILL)
    assert not OomBaseline([]).killed(8, 3)  # it exited by itself
    monkeypatch.setattr(oom, "kernel_log", lambda: [])
    assert not OomBaseline([]).killed(8, KILL)
