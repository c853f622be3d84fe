"""The processes of a cluster as the kernel sees them (psutil): alive or not, stopped, ended.

Only reads of /proc and signals: nothing here waits for a process's exit status, which belongs
to whoever started it (see `Cluster.exit_status`).
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import time
from collections.abc import Iterable
from typing import Any

import psutil

__all__ = [
    "Exits",
    "alive",
    "mpi_segments",
    "parent_pid",
    "proc_cmd",
    "process_of",
    "send",
    "stopped",
    "wait_dead",
]

# Shared memory that an MPI library removes only in MPI_Finalize, which a killed rank never
# reaches: OpenMPI's segments (vader in 4.x, sm in 5.x), 8 MiB a run left in /dev/shm.
_MPI_SHM = re.compile(r" (/dev/shm/(?:vader|sm)_segment\.\S*)$", re.MULTILINE)


def process_of(launcher: Any) -> psutil.Process | None:
    """The process an ipyparallel launcher started, if it started one here."""
    proc = getattr(launcher, "process", None)
    return proc if isinstance(proc, psutil.Process) else None


def descendants(pids: Iterable[int]) -> dict[int, list[psutil.Process]]:
    """Each of `pids`' descendants, parents before their children, from one look at the process
    table (psutil's `children(recursive=True)` reads the whole table at each call: once per
    launcher, twice a second, cost the kernel a tenth of a core while 16 engines started)."""
    below: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        below.setdefault(ppid, []).append(pid)
    found = {}
    for top in pids:
        order, queue, seen, at = [], [top], {top}, 0
        while at < len(queue):
            for child in below.get(queue[at], []):
                if child not in seen:
                    seen.add(child)
                    queue.append(child)
                    with contextlib.suppress(psutil.Error):  # gone since
                        order.append(psutil.Process(child))
            at += 1
        found[top] = order
    return found


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process: one read of each /proc/PID/stat where there is a
    /proc (psutil's process list reads it twice, and more)."""
    if not os.path.isdir("/proc/self"):
        return {p.pid: p.info["ppid"] for p in psutil.process_iter(["ppid"]) if p.info["ppid"]}
    found = {}
    for pid in psutil.pids():
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{pid}/stat", "rb") as stat:
                data = stat.read()
            found[pid] = int(data[data.rindex(b")") + 2 :].split()[1])  # after "pid (comm) state"
    return found


def parent_pid(proc: psutil.Process) -> int | None:
    """None once the process is gone (a short-lived child may end between listing and asking)."""
    try:
        return int(proc.ppid())
    except psutil.Error:
        return None


def proc_cmd(proc: psutil.Process) -> list[str]:
    try:
        return list(proc.cmdline())
    except psutil.Error:
        return []


def mpi_segments(procs: list[psutil.Process]) -> set[str]:
    """The MPI shared-memory files these processes have mapped (see `_MPI_SHM`). From
    /proc/PID/maps: psutil's `memory_maps` reads smaps, ~30 ms for a process with torch."""
    paths: set[str] = set()
    for proc in procs:
        with contextlib.suppress(OSError), open(f"/proc/{proc.pid}/maps") as f:
            paths.update(_MPI_SHM.findall(f.read()))
    return paths


class Exits:
    """Which of a set of processes have ended, in one `poll()` of their pidfds (Linux 5.3+;
    a pidfd is readable once its process has ended, zombie or reaped, and reading it reaps
    nothing). Where there are no pidfds, each process is looked at through psutil. A stopped
    process has not ended. Cheap enough to ask before every cell (~5 us for a cluster)."""

    def __init__(self) -> None:
        self._poll = select.poll()
        self._fds: dict[int, int] = {}  # fd -> pid
        self._others: dict[int, psutil.Process] = {}  # no pidfd for them
        self._ended: set[int] = set()

    def add(self, proc: psutil.Process) -> None:
        try:
            fd = os.pidfd_open(proc.pid)  # type: ignore[attr-defined,unused-ignore]
        except ProcessLookupError:
            self._ended.add(proc.pid)
        except (AttributeError, OSError):
            self._others[proc.pid] = proc
        else:
            self._fds[fd] = proc.pid
            self._poll.register(fd, select.POLLIN)

    def __contains__(self, pid: int) -> bool:
        return pid in self._others or pid in self._ended or pid in self._fds.values()

    def ended(self) -> set[int]:
        """The pids that have ended (a set: one look at all)."""
        self._ended.update(self._fds[fd] for fd, _ in self._poll.poll(0))
        self._ended.update(pid for pid, proc in self._others.items() if not alive(proc))
        return self._ended

    def close(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()


def alive(proc: psutil.Process) -> bool:
    """Running (a zombie has stopped running: it only waits for its parent to collect it)."""
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def wait_dead(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until no process runs. A killed nanny is reparented to init and stays a zombie
    until init reaps it, which takes init a second or more: a zombie counts as gone."""
    deadline = time.monotonic() + timeout
    left = procs
    while left and time.monotonic() < deadline:
        left = [p for p in left if alive(p)]
        if left:
            time.sleep(0.005)
    return left


def send(proc: psutil.Process, sig: int) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        proc.send_signal(sig)


def stopped(proc: psutil.Process) -> bool:
    """Stopped by SIGSTOP, Ctrl-Z or a debugger: it answers nothing until continued."""
    try:
        return proc.status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False
