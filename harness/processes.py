"""Processes the tests start, watched and ended: what a kernel, a server or a cluster left.

Shared by the notebook, kernel and browser tests: every test that starts a kernel or a server
records its descendants while it runs and checks that none outlives it. Also the time a test
lets a fault take to be named (`NAMED_S`), and Ctrl-C sent once ranks reach the code to
interrupt (`interrupt_once_created`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import psutil


@contextlib.contextmanager
def watch_descendants(
    pid: int, seen: dict[int, psutil.Process], every_s: float = 0.1
) -> Iterator[None]:
    """Record `pid` and every descendant of it in `seen` while the block runs, every `every_s`.

    Sampling (not one look at the end) also catches processes that start and end inside one
    cell, such as the ranks of `!distnb doctor`, which would be invisible once orphaned.
    """
    stop = threading.Event()
    root = psutil.Process(pid)
    seen[pid] = root

    def sample() -> None:
        with contextlib.suppress(psutil.Error):
            for child in root.children(recursive=True):
                seen.setdefault(child.pid, child)

    def loop() -> None:
        while not stop.wait(every_s):
            sample()

    thread = threading.Thread(target=loop, name="watch-descendants", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        sample()


def running(proc: psutil.Process) -> bool:
    """Alive and not a zombie (a zombie has exited; it only waits for its parent to reap it)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def still_running(procs: Any, timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if running(p)]
    return alive


def kill(procs: list[psutil.Process]) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGKILL)


def describe(procs: list[psutil.Process]) -> str:
    out = []
    for proc in procs:
        try:
            out.append(f"{proc.pid} {' '.join(proc.cmdline())[:100]}")
        except psutil.Error:
            out.append(str(proc.pid))
    return "; ".join(out)


def remove_kernel_files(pids: Iterable[int]) -> None:
    """Remove what the kernels `pids` left in the temporary folder: ipykernel's debugger writes
    the cells it is asked about to `<tmp>/ipykernel_<pid>/` and never removes them."""
    for pid in pids:
        shutil.rmtree(Path(tempfile.gettempdir()) / f"ipykernel_{pid}", ignore_errors=True)


ANSI = re.compile(r"\x1b\[[0-9;]*m")
# "Named rather than hanging": how long a test lets a fault, mismatch or release take before it
# fails. Far above the real times (well under 2 s on an idle machine, bench/ measures them) so a
# loaded machine passes, far below the timeouts the cells set (60 s) or the hang there would be.
NAMED_S = 30.0


def plain(text: str) -> str:
    """Text without terminal colour codes."""
    return ANSI.sub("", text)


def running_pids(pids: list[int]) -> list[int]:
    """The pids that still run (a zombie waiting for init to reap it has stopped)."""
    alive = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            if running(psutil.Process(pid)):
                alive.append(pid)
    return alive


def children_of_this_process() -> list[int]:
    return [p.pid for p in psutil.Process(os.getpid()).children(recursive=True)]


class Interrupter(threading.Thread):
    """Sends this process SIGINT (Ctrl-C) once every rank has made `{marker}{rank}`: the ranks
    are then inside the code to interrupt. `sent` is when it did (None if the ranks never got
    there). Join it after the interrupted call."""

    def __init__(self, marker: Path, ranks: tuple[int, ...], after_s: float = 0.0) -> None:
        super().__init__(name="interrupter", daemon=True)
        self.marker, self.ranks, self.after_s = marker, ranks, after_s
        self.sent: float | None = None

    def run(self) -> None:
        deadline = time.monotonic() + 600  # a loaded machine starts ranks' code slowly
        while not all(Path(f"{self.marker}{r}").exists() for r in self.ranks):
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)
        time.sleep(self.after_s)
        self.sent = time.monotonic()
        os.kill(os.getpid(), signal.SIGINT)


def interrupt_once_created(
    marker: Path, ranks: tuple[int, ...], after_s: float = 0.0
) -> Interrupter:
    """Start an `Interrupter` (see there), which waits `after_s` more before it sends."""
    thread = Interrupter(marker, ranks, after_s)
    thread.start()
    return thread
