"""A watchman for the kernel: kills the cluster's processes if the kernel dies without stopping.

`python -m distnb.reaper` reads lines from its stdin, a pipe whose other end only the
kernel holds: `pid N` adds a process to kill, `dir PATH` a folder to remove, `done` ends it
quietly. If the kernel dies in any way (SIGKILL, OOM, a crashed notebook server), the pipe
closes; the reaper reads EOF, kills every process it was told about and removes the folders, so
no engine, nanny or controller outlives its kernel, and no profile folder is left in /tmp.
It imports nothing heavy, so it costs a few MB.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys


def main() -> None:
    pids: set[int] = set()
    dirs: list[str] = []
    for line in sys.stdin:
        word, _, arg = line.strip().partition(" ")
        if word == "pid":
            pids.add(int(arg))
        elif word == "dir":
            dirs.append(arg)
        elif word == "done":
            return
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for path in dirs:
        shutil.rmtree(path, ignore_errors=True)


class Reaper:
    """The kernel's end of the pipe."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "distnb.reaper"],
            stdin=subprocess.PIPE,
            text=True,
            # Its own session: a Ctrl-C meant for the kernel's process group must not reach it.
            start_new_session=True,
        )
        self._told: set[int] = set()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def watch(self, pids: list[int]) -> None:
        new = [pid for pid in pids if pid not in self._told]
        if new and self._proc.stdin is not None:
            self._proc.stdin.write("".join(f"pid {pid}\n" for pid in new))
            self._proc.stdin.flush()
            self._told.update(new)

    def remove_later(self, path: str) -> None:
        """Have the reaper remove `path` if the kernel dies."""
        if self._proc.stdin is not None:
            self._proc.stdin.write(f"dir {path}\n")
            self._proc.stdin.flush()

    def close(self) -> None:
        if self._proc.stdin is not None:
            try:
                self._proc.stdin.write("done\n")
                self._proc.stdin.close()
            except BrokenPipeError:
                pass
        self._proc.wait(timeout=5)


if __name__ == "__main__":
    main()
