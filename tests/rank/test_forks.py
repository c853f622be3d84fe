"""The engines of one machine, forked from one launcher that imported torch and the engine once
(`distnb.rank.forks`): real engines, their own logs and exit statuses, and their end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from distnb.session import Session
from distnb.session.cluster.members import Role
from harness.processes import NAMED_S


def forks(tmp_path: Path, *engine_args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "distnb.rank.forks", "2", str(tmp_path / "forks"), *engine_args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def files(folder: Path, suffix: str, count: int) -> list[Path]:
    """The `count` files of `folder` that end in `suffix`, once there are that many."""
    deadline = time.monotonic() + NAMED_S
    while len(found := sorted(folder.glob(f"*{suffix}"))) < count:
        assert time.monotonic() < deadline, f"{len(found)} {suffix} files, not {count}"
        time.sleep(0.05)
    return found


def test_each_engine_writes_its_own_log_and_its_exit_status_is_kept(tmp_path: Path) -> None:
    launcher = forks(tmp_path, f"--profile-dir={tmp_path / 'none'}")
    assert launcher.wait(timeout=NAMED_S) == 1  # an engine failed
    logs = files(tmp_path / "forks", ".log", 2)
    for log in logs:
        assert "Profile directory" in log.read_text() and "not found" in log.read_text()
        assert (tmp_path / "forks" / f"{log.stem}.exit").read_text() == "1"
    assert len({log.stem for log in logs} - {str(launcher.pid)}) == 2  # two engines, not it


def test_sigterm_to_the_launcher_ends_every_engine(tmp_path: Path) -> None:
    (tmp_path / "profile" / "security").mkdir(parents=True)
    # engines that wait for a controller's connection file that never comes
    launcher = forks(tmp_path, f"--profile-dir={tmp_path / 'profile'}")
    pids = [int(log.stem) for log in files(tmp_path / "forks", ".log", 2)]
    assert {p.pid for p in psutil.Process(launcher.pid).children()} >= set(pids)
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=NAMED_S) == 1
    for pid in pids:
        assert (tmp_path / "forks" / f"{pid}.exit").read_text() == str(-signal.SIGTERM)


def test_engines_wait_for_a_late_controller(tmp_path: Path) -> None:
    # ipyparallel's engine waits 10 s for the connection file and 5 s for the answer to its
    # registration; a loaded machine's controller can take longer than both
    (tmp_path / "profile" / "security").mkdir(parents=True)
    launcher = forks(tmp_path, f"--profile-dir={tmp_path / 'profile'}")
    try:
        logs = files(tmp_path / "forks", ".log", 2)
        deadline = time.monotonic() + NAMED_S
        while not all("Waiting up to" in log.read_text() for log in logs):
            assert time.monotonic() < deadline, [log.read_text() for log in logs]
            time.sleep(0.05)
        for log in logs:
            assert "Waiting up to 300.0 seconds for it to arrive" in log.read_text()
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=NAMED_S)
    from distnb.rank.engine import Engine

    assert Engine().timeout == 60.0


@pytest.mark.cluster
def test_a_sessions_engines_are_forked_from_one_launcher(session: Session) -> None:
    cluster = session.cluster
    assert cluster is not None
    cluster.members.track()
    (launcher,) = [m for m in cluster.members if m.role is Role.LAUNCHER]
    assert "distnb.rank.forks" in psutil.Process(launcher.pid).cmdline()
    engines = {m.pid: m for m in cluster.members if m.role is Role.ENGINE}
    assert set(engines) == {info.pid for info in session.ranks}
    for pid, member in engines.items():
        assert member.parent == launcher.pid
        log = cluster.members.log_path(pid)
        assert log == os.path.join(os.path.dirname(log), f"{pid}.log")
        assert not cluster.members.log_shared(pid)
    said = session.run("print('from', rank)")
    assert [said.outputs[r].stdout for r in (0, 1)] == ["from 0\n", "from 1\n"]
