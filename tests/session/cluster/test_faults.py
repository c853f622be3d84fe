"""Fault injection: every process of a session's cluster killed in each phase, on real processes.

Each case kills one process (controller, its heart monitor, an engine, a nanny, the reaper)
while the ranks are idle, run Python, or wait at a checked collective, or while the cluster
starts, stops or restarts, and asserts what a user sees: the error type and text (which process,
what to run), that it comes instead of a hang or a timeout (generous bounds; how soon is a
bench's figure), `status()` saying it, a working cluster after `restart()`, and no process or
shared-memory board left once the session stops. One session is shared and restarted after each
fault; where a fault leaves it usable (the reaper, a stopped rank), the next case goes on with
it. The kernel's own death is in `test_kernel_faults.py`.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from distnb.errors import RankDiedError, RankTimeoutError, SessionError
from distnb.session import Session
from distnb.session import start as start_session
from distnb.session.cluster import Cluster
from distnb.session.cluster.engines import Local
from distnb.session.cluster.members import Member, Members, Role
from distnb.session.control import boards_pattern
from distnb.session.options import REGISTER_TIMEOUT_S
from harness.processes import NAMED_S, children_of_this_process, plain, running_pids

pytestmark = pytest.mark.cluster

# a start that cannot succeed says so well before the engines' register timeout runs out
STARTED_S = REGISTER_TIMEOUT_S / 2
SLEEP = "import time\ntime.sleep(60)\n"


class Matrix:
    """The shared session, and every pid and board of every cluster it has had."""

    def __init__(self) -> None:
        self.s = start_session(2, progress=False)
        self.pids: set[int] = set()
        self.sessions: set[str] = set()
        self.note()

    def note(self) -> None:
        if self.s.running and self.s.control is not None:
            self.pids.update(self.s.pids())
            self.sessions.add(self.s.control.session_id)

    def member(self, role: Role, rank: int = 1) -> Member:
        """The member of `role` (of `rank`, for an engine or a nanny), once the cluster has
        tracked it: on a busy machine a process may show up after the last tracking, so the
        cluster tracks its processes again until it is there (a bound, not a wait: it is
        usually there at once)."""
        cluster = self.s.cluster
        assert cluster is not None
        pid = self.s.ranks[rank].pid
        deadline = time.monotonic() + NAMED_S
        while True:
            cluster.members.track()
            found = [m for m in cluster.members if m.role is role and _of(m, role, pid)]
            if len(found) == 1 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        members = list(cluster.members)
        assert len(found) == 1, f"no one {role.value} of rank {rank} (pid {pid}) in {members}"
        return found[0]

    def recover(self) -> None:
        """`restart()` gives a working cluster, and the old one is gone."""
        old = self.s.pids()
        self.s.restart()
        self.note()
        assert not running_pids(old)
        assert self.s.run("x = torch.ones(1)\ndist.all_reduce(x)\nx.item()").result(1) == "2.0"
        assert self.s.status().note == ""


def _of(member: Member, role: Role, rank_pid: int) -> bool:
    """Whether `member` is the engine or nanny of the rank with `rank_pid` (any other role has
    one member)."""
    if role is Role.ENGINE:
        return member.pid == rank_pid
    return member.parent == rank_pid if role is Role.NANNY else True


@pytest.fixture(scope="module")
def matrix() -> Iterator[Matrix]:
    m = Matrix()
    yield m
    m.note()
    m.s.stop()
    assert not running_pids(sorted(m.pids))
    assert not [f for sid in m.sessions for f in glob.glob(boards_pattern(sid))]


@pytest.fixture(autouse=True)
def _leave_it_working(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that failed before its `recover` leaves the next one a working cluster, so one
    failure is reported once, not again by every test after it."""
    yield
    if "matrix" in request.fixturenames:
        m: Matrix = request.getfixturevalue("matrix")
        if m.s.running and m.s.broken:
            m.s.restart()
            m.note()


def kill_at_cell_start(pid: int, sig: int = signal.SIGKILL) -> str:
    """A cell in which rank 0 sends `sig` to `pid` at once, then both ranks sleep."""
    return f"import os\nif rank == 0:\n    os.kill({pid}, {int(sig)})\n" + SLEEP


def when_waiting(s: Session, rank: int, action: Callable[[], None]) -> threading.Thread:
    """Run `action` once `rank` waits at a checked collective in the next cell (its beacon)."""
    run_id = s._runs + 1
    assert s.control is not None
    control = s.control

    def watch() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if any(b.waiting and b.run_id == run_id for b in control.beacons([rank])):
                action()
                return
            time.sleep(0.005)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def gone(pid: int) -> None:
    """Wait until `pid` has ended, all its threads included (its pidfd is readable then; a
    SIGKILLed engine's main thread shows as a zombie a moment before its other threads end)."""
    fd = os.pidfd_open(pid)
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        assert poller.poll(10_000), f"process {pid} still runs"
    finally:
        os.close(fd)


def raised(s: Session, code: str, **kwargs: Any) -> tuple[BaseException, float]:
    started = time.monotonic()
    with pytest.raises((RankDiedError, SessionError, RankTimeoutError)) as info:
        s.run(code, **kwargs)
    return info.value, time.monotonic() - started


# --- a rank's engine ------------------------------------------------------------------------


def test_a_rank_terminated_mid_cell_is_named_at_once(matrix: Matrix) -> None:
    # ipyparallel's engine would finish the cell first (forever, here); SIGKILL mid-cell is in
    # test_lifecycle.py
    s = matrix.s
    sig = signal.SIGTERM
    s.run("print('an earlier cell', rank)")
    pid = matrix.member(Role.ENGINE, rank=1).pid
    code = "print('cell started', rank, flush=True)\n" + kill_at_cell_start(pid, sig)
    err, took = raised(s, code)
    assert isinstance(err, RankDiedError), err
    text = str(err)
    assert f"rank 1 (pid {pid} on" in text and f"killed by {signal.Signals(sig).name}" in text
    assert "%dist_restart" in text and took < NAMED_S
    assert "an earlier cell" not in text  # only this cell's output
    assert f"killed by {signal.Signals(sig).name}" in s.status().note
    matrix.recover()


def test_a_rank_waiting_at_a_collective_killed(matrix: Matrix) -> None:
    s = matrix.s
    pid = matrix.member(Role.ENGINE, rank=0).pid
    killed: list[float] = []
    when_waiting(s, 0, lambda: (killed.append(time.monotonic()), os.kill(pid, signal.SIGKILL)))
    code = "x = torch.ones(1)\nif rank == 1:\n    time.sleep(60)\ndist.all_reduce(x)\n"
    err, _ = raised(s, "import time\n" + code)
    assert isinstance(err, RankDiedError) and f"rank 0 (pid {pid} on" in str(err)
    assert "killed by SIGKILL" in str(err)
    assert time.monotonic() - killed[0] < NAMED_S
    matrix.recover()


def test_a_peer_released_after_a_death_says_where_it_waited_in_one_line(matrix: Matrix) -> None:
    """The survivor distnb interrupts is said as one line, where it was at the user's line, not
    as a traceback through the frames of torch's and distnb's it waited in."""
    s = matrix.s
    code = "x = torch.ones(4)\nif rank == 1:\n    os.kill(os.getpid(), 9)\ndist.all_reduce(x)\n"
    err, _ = raised(s, "import os\n" + code)
    assert isinstance(err, RankDiedError) and "rank 1 (pid" in str(err)
    (survivor,) = [f for f in err.failures if f.rank == 0]
    assert survivor.summary.startswith(
        "KeyboardInterrupt: distnb interrupted it when a peer died; it was waiting at all_reduce #"
    ), survivor.summary
    assert survivor.summary.endswith(" line 5) for rank 1"), survivor.summary
    shown = plain("\n".join(err._render_traceback_()))
    assert "[rank 0] KeyboardInterrupt: distnb interrupted it" in shown
    assert "File " not in shown and "/distnb/" not in shown, shown
    matrix.recover()


def test_a_rank_aborted_by_gloo_shows_that_cells_line_and_glooss_reason(matrix: Matrix) -> None:
    s = matrix.s
    s.run("print('Nothing was sent; an earlier cell', rank)")
    code = (
        "t = torch.arange(5.0) if rank == 0 else torch.arange(10.0)\n"
        "print('about to broadcast', flush=True)\n"
        "dist.broadcast(t, src=1)\n"
    )
    err, took = raised(s, code, check=False, timeout=30)
    text = str(err)
    assert isinstance(err, RankDiedError), text
    assert "rank 0 (pid" in text and "killed by SIGABRT" in text, text
    assert "at line 3: dist.broadcast(t, src=1)" in text
    assert "about to broadcast" in text and "gloo::EnforceNotMet" in text
    assert "Received data size doesn't match" in text
    assert "earlier cell" not in text and took < NAMED_S
    matrix.recover()


def test_a_rank_killed_while_idle_is_named_by_the_next_cell(matrix: Matrix) -> None:
    s = matrix.s
    pid = matrix.member(Role.ENGINE, rank=0).pid
    os.kill(pid, signal.SIGKILL)
    gone(pid)
    err, took = raised(s, "pass")
    assert isinstance(err, RankDiedError) and took < NAMED_S
    assert f"rank 0 (pid {pid} on" in str(err) and "killed by SIGKILL before cell" in str(err)
    assert f"rank 0 (pid {pid} on" in s.status().note
    with pytest.raises(SessionError, match="dist_restart"):
        s.run("pass")
    matrix.recover()


def test_a_stopped_rank_is_reported_stopped_and_continues(matrix: Matrix) -> None:
    s = matrix.s
    pid = matrix.member(Role.ENGINE, rank=1).pid
    code = "import os, signal\nif rank == 1:\n    os.kill(os.getpid(), signal.SIGSTOP)\n"
    with pytest.raises(RankTimeoutError) as info:
        s.run(code, timeout=1.5)
    report = {r.rank: r for r in info.value.reports}
    assert report[1].detail.startswith("stopped") and f"kill -CONT {pid}" in report[1].detail
    assert "rank 1 is stopped" in str(info.value) and report[0].state.value == "finished"
    os.kill(pid, signal.SIGCONT)
    # the interrupt sent at the timeout ends the old cell; the cluster goes on, no restart
    assert s.run("x = torch.ones(1)\ndist.all_reduce(x)\nx.item()").result(0) == "2.0"


# --- nannies, the controller and its heart monitor ---------------------------------------------


@pytest.mark.parametrize(
    ("role", "said"),
    [
        (Role.CONTROLLER, "controller (pid {pid}) was killed by SIGKILL"),
        (Role.HEART, "heart monitor (pid {pid}) died"),
        (Role.NANNY, "rank 1's nanny (pid {pid}"),
    ],
    ids=["controller", "heart-monitor", "nanny"],
)
def test_a_vital_process_killed_mid_cell(matrix: Matrix, role: Role, said: str) -> None:
    s = matrix.s
    pid = matrix.member(role).pid
    err, took = raised(s, kill_at_cell_start(pid))
    assert isinstance(err, SessionError), err
    assert said.format(pid=pid) in str(err) and "while cell" in str(err)
    assert "%dist_restart" in str(err) and took < NAMED_S
    assert said.format(pid=pid) in s.status().note
    matrix.recover()


def test_the_controller_terminated_while_a_rank_waits_at_a_collective(matrix: Matrix) -> None:
    s = matrix.s
    pid = matrix.member(Role.CONTROLLER).pid
    killed: list[float] = []
    when_waiting(s, 0, lambda: (killed.append(time.monotonic()), os.kill(pid, signal.SIGTERM)))
    code = "import time\nx = torch.ones(1)\nif rank == 1:\n    time.sleep(60)\ndist.all_reduce(x)\n"
    err, _ = raised(s, code)
    # on SIGTERM the controller ends its heart monitor, then itself: the controller is named
    assert isinstance(err, SessionError), err
    assert f"controller (pid {pid}) exited with code 0 while cell" in str(err)
    assert time.monotonic() - killed[0] < NAMED_S
    matrix.recover()


def test_the_controller_killed_while_idle(matrix: Matrix) -> None:
    # the same path as a nanny or the heart monitor: the next cell looks before it is sent
    s = matrix.s
    pid = matrix.member(Role.CONTROLLER).pid
    os.kill(pid, signal.SIGKILL)
    gone(pid)
    err, took = raised(s, "pass")
    assert isinstance(err, SessionError) and f"(pid {pid}" in str(err) and took < NAMED_S
    assert f"(pid {pid}" in s.status().note
    matrix.recover()


def test_a_killed_reaper_is_replaced_and_cells_go_on(matrix: Matrix) -> None:
    s = matrix.s
    assert s.cluster is not None
    reaper = s.cluster._reaper
    os.kill(reaper.pid, signal.SIGKILL)  # idle
    deadline = time.monotonic() + 5
    while reaper.restarts < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    s.run(f"import os\nif rank == 0:\n    os.kill({reaper.pid}, {int(signal.SIGTERM)})\n")
    deadline = time.monotonic() + 5
    while not (reaper.restarts == 2 and running_pids([reaper.pid])) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert reaper.restarts == 2 and running_pids([reaper.pid]) and s.status().note == ""
    matrix.note()


# --- starting, stopping, restarting -------------------------------------------------------------


def kill_when(monkeypatch: pytest.MonkeyPatch, method: str, role: Role) -> list[int]:
    """Patch `Cluster.<method>` to SIGKILL the first member with `role` before it runs (as
    soon as there is one: engines are forked once their launcher has imported torch)."""
    original = getattr(Cluster, method)
    killed: list[int] = []

    def patched(self: Cluster, *args: Any, **kwargs: Any) -> Any:
        deadline = time.monotonic() + NAMED_S
        while not killed:
            self.members.track()
            target = next((m for m in self.members if m.role is role), None)
            if target is None:
                assert time.monotonic() < deadline, f"no {role.value} started"
                time.sleep(0.01)
                continue
            os.kill(target.pid, signal.SIGKILL)
            killed.append(target.pid)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Cluster, method, patched)
    return killed


@pytest.mark.parametrize(
    ("method", "role", "said"),
    [
        ("wait_registered", Role.CONTROLLER, "the ipyparallel controller (pid {pid}) was killed"),
        ("wait_registered", Role.ENGINE, "engine (pid {pid}) was killed by SIGKILL before"),
        ("wait_all", Role.ENGINE, "engine (pid {pid}) was killed by SIGKILL"),
    ],
)
def test_a_process_killed_while_starting_fails_the_start_at_once(
    monkeypatch: pytest.MonkeyPatch, method: str, role: Role, said: str
) -> None:
    before = set(children_of_this_process())
    killed = kill_when(monkeypatch, method, role)
    started = time.monotonic()
    with pytest.raises(SessionError, match="did not start") as info:
        start_session(2, progress=False)
    assert said.format(pid=killed[0]) in str(info.value)
    assert "Nothing is left running" in str(info.value)
    assert time.monotonic() - started < STARTED_S  # named, not waited out
    assert not running_pids(sorted(set(children_of_this_process()) - before))


def test_processes_killed_during_stop_and_restart(
    matrix: Matrix, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = matrix.s
    assert s.cluster is not None
    victims = [matrix.member(Role.ENGINE, 0).pid, matrix.member(Role.CONTROLLER).pid]
    victims.append(s.cluster._reaper.pid)
    stop = Cluster.stop

    def dying_stop(self: Cluster, timeout: float = 2.0) -> list[int]:
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):  # stop runs again on the new cluster
                os.kill(pid, signal.SIGKILL)  # not waited for: they die while stop works
        return stop(self, timeout)

    monkeypatch.setattr(Cluster, "stop", dying_stop)
    old = s.pids()
    killed = kill_when(monkeypatch, "wait_registered", Role.ENGINE)
    with pytest.raises(SessionError, match="did not start"):
        s.restart()  # the old cluster's stop, then a start whose engine dies
    assert not running_pids(old) and not running_pids(killed) and not s.running
    monkeypatch.undo()
    matrix.recover()


# --- launchers that cannot start engines ---------------------------------------------------------


@pytest.mark.parametrize(
    ("engine_cmd", "said"),
    [
        ([sys.executable, "-c", "import sys; sys.exit('no GPU here, giving up')"], "no GPU here"),
        (["/nonexistent/python3"], "/nonexistent/python3"),
        ([sys.executable, "-c", "import time; time.sleep(60)"], "0 of 2 engines registered"),
    ],
    ids=["exits-at-once", "command-missing", "never-registers"],
)
def test_a_launcher_that_cannot_start_engines_fails_fast(
    monkeypatch: pytest.MonkeyPatch, engine_cmd: list[str], said: str
) -> None:
    monkeypatch.setattr(Local, "launcher_settings", lambda self: {"engine_cmd": engine_cmd})
    before = set(children_of_this_process())
    started = time.monotonic()
    with pytest.raises(SessionError, match="did not start") as info:
        start_session(2, progress=False, register_timeout=2)
    # named (at once, or at the 2 s register timeout), not waiting for the 60 s engine
    assert said in str(info.value) and time.monotonic() - started < 30
    assert not running_pids(sorted(set(children_of_this_process()) - before))


def test_a_launchers_output_is_named_after_ipyparallel_removed_its_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ipyparallel reads an ended launcher's log and removes the file; on a busy machine that
    can come before distnb keeps a link to it. The launcher's own words are still named."""
    engine_cmd = [sys.executable, "-c", "import sys; sys.exit('no GPU here, giving up')"]
    monkeypatch.setattr(Local, "launcher_settings", lambda self: {"engine_cmd": engine_cmd})
    keep_log, removed = Members._keep_log, []

    def keep_log_late(self: Members, pid: int, path: Any) -> None:
        launcher = self._launcher_by_pid[pid]
        if launcher is not self._ipp.controller:  # an engine's: let it end, and ipyparallel
            launcher.process.wait(30)  # read its log and remove the file, as it does then
            launcher.get_output(remove=True)
            removed.append(not os.path.exists(path))
        keep_log(self, pid, path)

    monkeypatch.setattr(Members, "_keep_log", keep_log_late)
    with pytest.raises(SessionError, match="did not start") as info:
        start_session(2, progress=False, register_timeout=2)
    assert removed and all(removed), "ipyparallel kept the log: the case was not tested"
    assert "no GPU here" in str(info.value)


def test_engines_still_working_extend_the_wait_for_registration(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Engines that work (import torch on a busy machine, in a 1-CPU container) are not
    called stuck at the register timeout; those that then wait for nothing are, a timeout
    after they stop working."""
    # The engines work 2 s of CPU from when the wait begins (a loaded machine may take longer
    # than that to get from launching them to waiting), then wait for nothing.
    waiting = tmp_path / "waiting"
    work = (
        f"import os, time\nwhile not os.path.exists({str(waiting)!r}): pass\n"
        "t = time.process_time()\nwhile time.process_time() - t < 2: pass\n"
    )
    engine_cmd = [sys.executable, "-c", work + "time.sleep(60)"]
    monkeypatch.setattr(Local, "launcher_settings", lambda self: {"engine_cmd": engine_cmd})
    wait_registered = Cluster.wait_registered

    def wait_after_marking(self: Cluster, *args: Any) -> Any:
        waiting.touch()
        return wait_registered(self, *args)

    monkeypatch.setattr(Cluster, "wait_registered", wait_after_marking)
    with pytest.raises(SessionError, match="did not start") as info:
        start_session(2, progress=False, register_timeout=1)
    said = re.search(
        r"0 of 2 engines registered in (\d+) s, the last 1 s without progress", str(info.value)
    )
    assert said is not None, str(info.value)
    assert int(said.group(1)) >= 2  # each engine worked 2 s of CPU before it idled


# Engines that start short-lived helpers while they boot, as libraries do at import (a CUDA
# build of torch asks ldconfig, a compiler probes its toolchain): each ends within milliseconds.
CHURN = """
import subprocess, sys, threading, time
from distnb.rank import engine, forks
def churn():
    end = time.monotonic() + 8
    while time.monotonic() < end:
        helpers = [subprocess.Popen(["true"]) for _ in range(8)]
        for helper in helpers:
            helper.wait()
boot = engine.main
def main():
    threading.Thread(target=churn, daemon=True).start()
    boot()
engine.main = main
sys.exit(forks.main(sys.argv[1:]))
"""


def test_helpers_that_engines_start_and_end_while_booting_are_not_taken_for_dead_launchers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    track = Members.track
    engine = [sys.executable, "-c", CHURN]
    monkeypatch.setattr(Local, "launcher_settings", lambda self: {"engine_cmd": engine})

    def track_often(self: Members) -> None:
        for _ in range(50):  # many looks at a churning process tree, as a slow start makes
            track(self)

    monkeypatch.setattr(Members, "track", track_often)
    with start_session(2, progress=False) as s:
        result = s.run("rank")
        assert [result.result(r) for r in (0, 1)] == ["0", "1"]
