"""The processes of a cluster: each one's role, whether it has died and how, and its log.

Terms: a **member** is a process distnb started for a session's cluster (the controller, its
heart monitor, an engine, an engine's nanny, a launcher such as mpiexec), with its **role**.
`Members` records every member the launchers started (their children and theirs), tells the
reaper about each (it kills them if the kernel dies without stopping them), answers "has a
member the cluster needs died?" in one poll of their pidfds, and how it died (an exit status,
the OOM killer, or, for a rank on another host, that it left the cluster).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import psutil

from distnb.reaper import Reaper
from distnb.session.cluster import processes
from distnb.session.cluster.engines import forks_folder
from distnb.session.cluster.oom import OOM_TEXT, OomBaseline
from distnb.session.load import stretched

__all__ = ["LEFT_CLUSTER", "Member", "Members", "Role", "describe", "exit_text", "own_lines"]

# How an engine on another host died, as far as the kernel can tell: the controller stopped
# hearing it (a nanny there reports a death; a cut link, only the heartbeat's silence tells).
LEFT_CLUSTER = (
    "left the cluster (the process died, or its host or the network to it went down; the exit "
    "status of a process on another host is not known here)"
)
_SETTLE_S = 0.5  # for a dead process's parent to end too (see `Members.dead`), on a quiet machine
_SETTLE_MAX_S = 3.0


def _settle_s() -> float:
    """`_SETTLE_S`, longer on a busy machine (`load.stretched`), so that the cause is named
    rather than the first process that happened to end."""
    return stretched(_SETTLE_S, _SETTLE_MAX_S)


_LINE_CHARS = 300
# ipyparallel's log lines: "2026-11-21 09:00:00.123 [IPEngine...] ..."
_IPP_LOG = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[.,]\d+ \[")


class Role(str, Enum):
    """What a member of the cluster is, in the words a report uses."""

    CONTROLLER = "the ipyparallel controller"
    HEART = "the ipyparallel controller's heart monitor"
    ENGINE = "engine"
    NANNY = "nanny"
    LAUNCHER = "the engines' launcher"
    OTHER = "process"

    @property
    def vital(self) -> bool:
        """The cluster cannot work without it (a launcher may end once its engines run)."""
        return self in (Role.CONTROLLER, Role.HEART, Role.ENGINE, Role.NANNY)


@dataclass(frozen=True, slots=True)
class Member:
    """A process of the cluster: its pid, role, and the pid that started it (0: a launcher)."""

    pid: int
    role: Role
    parent: int = 0


class Members:
    """Every process an ipyparallel cluster's launchers started here (see the module)."""

    def __init__(self, ipp_cluster: Any, reaper: Reaper, folder: str) -> None:
        self._ipp = ipp_cluster
        self._reaper = reaper
        self._folder = folder  # where a dead engine's log is kept (see `_launcher_of`)
        self._forks = forks_folder(folder)  # forked engines' logs and exit statuses
        self._procs: dict[int, psutil.Process] = {}
        self._members: dict[int, Member] = {}
        self._log_marks: dict[int, int] = {}
        self._marked: dict[int, str] = {}  # pid -> the log `mark_logs` found for it
        self._launcher_by_pid: dict[int, Any] = {}
        self._logs: dict[int, str] = {}  # pid -> a hard link to its launcher's log file
        self._exits = processes.Exits()  # of the vital processes and the launchers'
        self._oom = OomBaseline([])

    def __iter__(self) -> Any:
        return iter(list(self._members.values()))

    def track(self) -> None:
        """Record every process the launchers started (their children and theirs) with its
        role, and tell the reaper, which kills them if the kernel dies without stopping them."""
        engine_launchers = {p.pid for p in self._engine_processes()}
        tops = self._launcher_processes()
        below = processes.descendants(top.pid for top in tops)
        for top in tops:
            self._add(top, role_of(top, engine_launchers), 0)
            self._launcher_of(top.pid)
            with contextlib.suppress(psutil.NoSuchProcess):
                for child in below[top.pid]:
                    ppid = processes.parent_pid(child)
                    if ppid is None:
                        continue  # gone already: a short-lived helper, not a launcher's own
                    forked = self._forked(child.pid, "log")  # an engine has its command line
                    role = Role.ENGINE if forked else child_role(child, self._members.get(ppid))
                    self._add(child, role, ppid)
        self._reaper.watch(list(self._procs))

    def count_ooms(self, pids: Iterable[int]) -> None:
        """Right after the ranks start: their OOM counts so far, to weigh a death against."""
        self._oom = OomBaseline(list(pids))

    def _add(self, proc: psutil.Process, role: Role, parent: int) -> None:
        known = self._members.get(proc.pid)
        if known is not None and known.role in (Role.LAUNCHER, Role.OTHER) and role is Role.ENGINE:
            # looked at between its fork and its exec (the parent's command line), or a forked
            # engine before it opened its log: it is an engine, as it now shows
            self._members[proc.pid] = Member(proc.pid, role, parent)
            if proc.pid not in self._exits:
                self._exits.add(proc)
        if proc.pid not in self._procs:
            self._procs[proc.pid] = proc
            self._members[proc.pid] = Member(proc.pid, role, parent)
            if role.vital or parent == 0:
                self._exits.add(proc)

    def _launcher_processes(self) -> list[psutil.Process]:
        controller = processes.process_of(self._ipp.controller)
        return ([controller] if controller is not None else []) + self._engine_processes()

    def _engine_processes(self) -> list[psutil.Process]:
        return [p for p in map(processes.process_of, self._launchers()[1:]) if p is not None]

    def _launchers(self) -> list[Any]:
        """The controller's launcher, then every engine's (an engine set's own where it has no
        launcher per engine, as mpiexec's)."""
        return [self._ipp.controller] + [
            la
            for es in self._ipp.engines.values()
            for la in (getattr(es, "launchers", {}).values() or [es])
        ]

    def raise_if_launcher_died(self) -> None:
        """While engines register: launchers' own processes and vital ones (short-lived helpers
        may come and go)."""
        for member in list(self._members.values()):
            if (member.parent == 0 or member.role.vital) and not self._up(member):
                output = self.log_tail(member.pid)
                raise RuntimeError(
                    f"{describe(member)} {self.how_died(member.pid)} before every engine "
                    "registered" + (f"; its output:\n{output}" if output else "")
                )

    def launcher_outputs(self, lines: int = 8) -> list[str]:
        """`what it is:\\nits last lines` for each process a launcher started."""
        return [
            f"{describe(m)}:\n{tail}"
            for m in self._members.values()
            if (m.parent == 0 or self._forked(m.pid, "log"))
            and (tail := self.log_tail(m.pid, lines=lines, ipp=True))
        ]

    def dead(self) -> Member | None:
        """A member the cluster cannot work without (controller, its heart monitor, an engine,
        a nanny) that has died, or None. One poll() of their pidfds.

        One death brings others: a nanny exits when its engine dies, a controller told to
        stop ends its heart monitor first. The one named is the cause: a dead child's parent,
        if that ends too within `_SETTLE_S`.
        """
        ended = self._exits.ended()
        gone = next((m for m in self._members.values() if m.role.vital and m.pid in ended), None)
        parent = self._members.get(gone.parent) if gone is not None else None
        if parent is not None and parent.role.vital:
            # Polled, not waited for: the parent may be the kernel's child, whose exit status
            # is ipyparallel's thread's to collect (see `exit_status`).
            deadline = time.monotonic() + _settle_s()
            while self._up(parent) and time.monotonic() < deadline:
                time.sleep(0.01)
            if not self._up(parent):
                return parent
        return gone

    def _up(self, member: Member) -> bool:
        if member.pid in self._exits:
            return member.pid not in self._exits.ended()
        return processes.alive(self._procs[member.pid])

    def running(self, pid: int) -> bool:
        """Whether a process of this cluster runs (a zombie does not)."""
        proc = self._procs.get(pid)
        return proc is not None and processes.alive(proc)

    def stopped(self, pid: int) -> bool:
        """Whether a process of this cluster is stopped (SIGSTOP, a debugger's stop): it cannot
        answer anything until it is continued."""
        proc = self._procs.get(pid)
        return proc is not None and processes.stopped(proc)

    def how_died(self, pid: int, here: bool = True, wait: float = 1.0) -> str:
        """`was killed by SIGKILL`, `exited with code 0`, `was killed by the OOM killer (...)`;
        for a process on another host (`here` False), that it left the cluster."""
        if not here:
            return LEFT_CLUSTER
        code = self.exit_status(pid, wait)
        return OOM_TEXT if self._oom.killed(pid, code) else exit_text(code)

    def alive(self) -> list[psutil.Process]:
        """Every process of this cluster still running."""
        return [p for p in self._procs.values() if processes.alive(p)]

    def engines_cpu_seconds(self) -> float:
        """The CPU time the engines on this machine (not the controller, whose heartbeat never
        stops) have used so far."""
        total = 0.0
        for pid, member in list(self._members.items()):
            if member.role in (Role.ENGINE, Role.LAUNCHER):
                with contextlib.suppress(psutil.Error):
                    times = self._procs[pid].cpu_times()
                    total += times.user + times.system
        return total

    def close(self) -> None:
        self._exits.close()

    def exit_status(self, pid: int, wait: float = 1.0) -> int | None:
        """The exit code of a process a launcher started (negative: killed by that signal);
        None for the others (their parent is not the kernel) or one still running.

        ipyparallel's launcher waits for its process in a thread of its own, and psutil keeps
        the status on the process object; a second waiter would race that thread for the
        status, and the loser gets None ("exit status unknown"). So this waits for the thread.
        """
        proc = self._procs.get(pid)
        launcher = self._launcher_of(pid)
        if proc is not None and self._forked(pid, "log"):
            return self._forked_exit(pid, wait)
        if proc is None or launcher is None:
            return None
        thread = getattr(launcher, "_wait_thread", None)
        if thread is not None:
            thread.join(wait)
            if thread.is_alive():
                return None
        try:
            code = proc.wait(0 if thread is not None else wait)
        except (psutil.TimeoutExpired, psutil.Error):
            return None
        return int(code) if code is not None else None

    # --- logs ----------------------------------------------------------------------------

    def mark_logs(self, pids: Iterable[int]) -> None:
        """Remember how far each process's log has come: what follows is the next cell's.

        A cell marks every rank's log twice: a log found once is kept (one stat a process at
        each mark, not the three of finding it again), and looked for anew if it is gone."""
        for pid in pids:
            path = self._marked.get(pid) or self.log_path(pid)
            try:
                self._log_marks[pid] = os.path.getsize(path) if path else 0
            except OSError:
                self._marked.pop(pid, None)
                continue
            if path:
                self._marked[pid] = path

    def log_tail(self, pid: int, lines: int = 5, since: int = 0, ipp: bool = False) -> str:
        """The last lines a process wrote to its log from byte `since` on that are not
        ipyparallel's own logging (which is what follows a crash, and hides what the crash
        printed, e.g. gloo's `EnforceNotMet ... Received data size doesn't match`), or with
        it (`ipp`: what an engine that never registered said, e.g. a registration timed out)."""
        path, written = self.log_path(pid), b""
        if path:
            with contextlib.suppress(OSError), open(path, "rb") as f:
                f.seek(since)
                written = f.read()
        else:  # ipyparallel read and removed the log at the launcher's end, which on a busy
            # machine can come before `track` kept a link to it: ipyparallel's copy
            output = getattr(self._launcher_of(pid), "_output", None)
            written = output.encode()[since:] if isinstance(output, str) else b""
        return "\n".join(own_lines(written.decode(errors="replace"), ipp)[-lines:])

    def log_since_mark(self, pid: int) -> str:
        """What a process wrote to its log since `mark_logs` last saw it."""
        return self.log_tail(pid, lines=100_000, since=self._log_marks.get(pid, 0))

    def log_shared(self, pid: int) -> bool:
        """Whether the process writes to its launcher's log with others (under mpiexec)."""
        own = self._launcher_of(pid) is not None or self._forked(pid, "log")
        return not own and bool(self.log_path(pid))

    def log_path(self, pid: int) -> str:
        """The log a process writes to (ranks under mpiexec share its log), or ""."""
        if forked := self._forked(pid, "log"):
            return forked
        launcher = self._launcher_of(pid)
        if launcher is None and (member := self._members.get(pid)) and member.parent:
            launcher = self._launcher_of(member.parent)  # an MPI rank writes to mpiexec's
        if launcher is None:
            return ""
        path = self._logs.get(launcher.process.pid, getattr(launcher, "output_file", None))
        return path if isinstance(path, str) and os.path.exists(path) else ""

    def _forked(self, pid: int, what: str) -> str:
        """A forked engine's file (`log`, `exit`: `distnb.rank.forks`), or "" if there is none."""
        path = os.path.join(self._forks, f"{pid}.{what}")
        return path if os.path.exists(path) else ""

    def _forked_exit(self, pid: int, wait: float) -> int | None:
        """A forked engine's exit status, as its launcher wrote it (within `wait` seconds)."""
        deadline = time.monotonic() + wait
        while not (path := self._forked(pid, "exit")) and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            with open(path or os.devnull) as f:
                return int(f.read())
        except ValueError:
            return None

    def _launcher_of(self, pid: int) -> Any:
        # Kept from `track`: in a kernel, whose event loop runs ipyparallel's callbacks, an
        # engine set forgets the launcher of an engine that died, and removes its log file;
        # a hard link keeps the log for the death report.
        if pid not in self._launcher_by_pid:
            for la in self._launchers():
                if getattr(getattr(la, "process", None), "pid", None) == pid:
                    self._launcher_by_pid[pid] = la
                    self._keep_log(pid, getattr(la, "output_file", None))
        return self._launcher_by_pid.get(pid)

    def _keep_log(self, pid: int, path: Any) -> None:
        if isinstance(path, str) and path:
            kept = os.path.join(self._folder, f"distnb-{pid}.log")
            with contextlib.suppress(OSError):
                os.link(path, kept)
                self._logs[pid] = kept


def role_of(proc: psutil.Process, engine_launchers: set[int]) -> Role:
    """The role of a launcher's own process (`engine_launchers`: the engine sets' pids)."""
    if proc.pid not in engine_launchers:
        return Role.CONTROLLER
    return Role.ENGINE if is_engine(proc) else Role.LAUNCHER  # mpiexec, srun, ssh, forks


def child_role(proc: psutil.Process, parent: Member | None) -> Role:
    """The role of a process a launched process started."""
    cmd = " ".join(processes.proc_cmd(proc))
    if "ipyparallel.engine.nanny" in cmd:
        return Role.NANNY
    if parent is None or parent.role is Role.ENGINE:
        # a rank's own children (DataLoader workers, compile workers): they come and go, and
        # a forked one has the engine's command line
        return Role.OTHER
    if parent.role is Role.CONTROLLER:
        return Role.HEART  # the controller's one child when it runs with threads
    return Role.ENGINE if is_engine(proc) else Role.OTHER  # under mpiexec, srun, ...


def is_engine(proc: psutil.Process) -> bool:
    """A Python running an engine (not a launcher such as mpiexec whose arguments name one)."""
    cmd = processes.proc_cmd(proc)
    if not cmd or "python" not in os.path.basename(cmd[0]):
        return False
    return any(
        w in ("distnb.rank.engine", "ipyparallel.engine") or w.endswith("ipengine") for w in cmd
    )


def describe(member: Member) -> str:
    """`the ipyparallel controller (pid 4242)`; ranks are named by the session."""
    return f"{member.role.value} (pid {member.pid})"


def exit_text(code: int | None) -> str:
    """`was killed by SIGABRT`, `exited with code 1`."""
    if code is None:
        return "died (exit status unknown)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with code {code}"


def own_lines(text: str, ipp: bool = False) -> list[str]:
    """The lines of a log that the process wrote itself, not ipyparallel's logging (which is
    what follows a crash, and would hide what the crash printed); long lines are cut."""
    lines = []
    for line in text.splitlines():
        if line.strip() and (ipp or not _IPP_LOG.match(line)):
            cut = line.rstrip()
            lines.append(cut if len(cut) <= _LINE_CHARS else cut[:_LINE_CHARS] + " ...")
    return lines
