"""Processes the tests start, watched and ended: what a kernel, a server or a cluster left.

Shared by the notebook, kernel and browser tests: every test that starts a kernel or a server
records its descendants while it runs and checks that none outlives it.
"""

from __future__ import annotations

import contextlib
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
