"""A watchman for the kernel: kills the cluster's processes if the kernel dies without stopping.

`python -m distnb.reaper MARK` reads lines from its stdin, a pipe whose other end only the kernel
holds: `pid N` adds a process to kill, `dir PATH` a folder to remove, `glob PATTERN` files to
remove (the ranks' shared-memory boards), `done` ends it quietly. If the kernel dies in any way
(SIGKILL, OOM, a crashed notebook server), the pipe closes; the reaper reads EOF, kills every
process it was told about and every process whose environment carries `DISTNB_REAPER=MARK`,
and removes the files, so no engine, nanny or controller outlives its kernel.

Why the mark: the kernel can tell the reaper a pid only after it has seen the process, and
some processes are born where the kernel does not look (the controller forks its heart monitor
a second after it starts, an engine its nanny). Every process the cluster launches gets the
mark in its environment and passes it on to its children, so the reaper finds them all, from
the first launch on. It imports nothing heavy, so it costs a few MB.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import sys
import threading

MARK_VAR = "DISTNB_REAPER"
_ROUNDS = 5  # kill, look again: a process may fork while its parent is being killed


def main() -> None:
    mark = sys.argv[1] if len(sys.argv) > 1 else ""
    # The kernel's SIGINT (Ctrl-C in a terminal) must not reach it; it has its own session too.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    pids: set[int] = set()
    paths: list[tuple[str, str]] = []
    for line in sys.stdin:
        word, _, arg = line.strip().partition(" ")
        if word == "pid":
            pids.add(int(arg))
        elif word in ("dir", "glob"):
            paths.append((word, arg))
        elif word == "done":
            return
    reap(pids, mark)
    for word, arg in paths:
        for path in glob.glob(arg) if word == "glob" else [arg]:
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)


def reap(pids: set[int], mark: str) -> None:
    """SIGKILL `pids` and every process marked `mark`, until none of them is left."""
    targets = set(pids)
    for _ in range(_ROUNDS):
        targets |= set(marked(mark))
        targets.discard(os.getpid())
        if not targets:
            return
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        targets = set()


def marked(mark: str) -> list[int]:
    """The pids of the processes whose environment holds `DISTNB_REAPER=mark` (a /proc scan,
    a few ms; processes of other users, and zombies, have no readable environment)."""
    if not mark:
        return []
    needle = f"{MARK_VAR}={mark}".encode()
    found = []
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(int(name))
    return found


class Reaper:
    """The kernel's end of the pipe. A reaper that dies (killed by a user, or by a tool that
    cleans up processes) is started again at once and told everything again, so the cluster is
    never left unguarded."""

    def __init__(self, mark: str) -> None:
        self.mark = mark
        self._lines: list[str] = []  # everything told so far, to tell a new reaper
        self._told: set[int] = set()
        self._lock = threading.Lock()
        self._closing = False
        self.restarts = 0
        with self._lock:  # its guard thread may look at `_proc` at once
            self._proc = self._spawn()

    def _spawn(self) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "distnb.reaper", self.mark],
            stdin=subprocess.PIPE,
            text=True,
            # Its own session: a Ctrl-C meant for the kernel's process group must not reach it.
            start_new_session=True,
        )
        if self._lines and proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):  # dead already: its guard starts another
                proc.stdin.write("".join(self._lines))
                proc.stdin.flush()
        threading.Thread(
            target=self._guard, args=(proc,), name="distnb-reaper", daemon=True
        ).start()
        return proc

    def _guard(self, proc: subprocess.Popen[str]) -> None:
        proc.wait()  # blocks in waitpid: costs nothing while the reaper lives
        with self._lock:
            if not self._closing and proc is self._proc:
                self._proc = self._spawn()
                self.restarts += 1

    @property
    def pid(self) -> int:
        return self._proc.pid

    def watch(self, pids: list[int]) -> None:
        new = [pid for pid in pids if pid not in self._told]
        if new:
            self._told.update(new)
            self._tell("".join(f"pid {pid}\n" for pid in new))

    def remove_later(self, path: str) -> None:
        """Have the reaper remove `path` if the kernel dies."""
        self._tell(f"dir {path}\n")

    def remove_matching_later(self, pattern: str) -> None:
        """Have the reaper remove the files matching `pattern` if the kernel dies."""
        self._tell(f"glob {pattern}\n")

    def _tell(self, text: str) -> None:
        with self._lock:
            self._lines.append(text)
            stdin = self._proc.stdin
            # A reaper that just died: its guard starts the next one, which is told all.
            with contextlib.suppress(BrokenPipeError, ValueError):
                if stdin is not None:
                    stdin.write(text)
                    stdin.flush()

    def close(self) -> None:
        with self._lock:
            self._closing = True
            proc = self._proc
        if proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError, ValueError):
                proc.stdin.write("done\n")
                proc.stdin.close()
        proc.wait(timeout=5)


if __name__ == "__main__":
    main()
