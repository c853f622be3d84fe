"""Each bench's output, kept: printed as usual and written to `bench/results/<name>.txt`.

    with saved("collectives-focus"):
        ...  # everything printed here goes to the terminal and to the file

The file starts with the command line and the machine (cores, load average, Python, torch, the
commit) and ends with the load average again, so a figure quoted from it says what it came
from. docs/performance.md quotes these files verbatim, and `bench/check.py` re-derives every
figure the README and docs/performance.md quote from them: a bench rerun changes the file, and
the check says which quoted figure no longer holds. `BENCH_RESULTS=0` prints only (a trial run
that must not replace the saved output).
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


class _Tee:
    """A stdout that writes to the terminal and a file alike."""

    def __init__(self, *streams: TextIO) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self) -> None:
        for s in self.streams:
            s.flush()


def load() -> str:
    """The load average over 1, 5 and 15 minutes: how busy the shared machine was."""
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def machine() -> str:
    """Cores, load, Python, torch (without importing it) and the commit of this checkout."""
    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = "-"
    return (
        f"# machine: {os.cpu_count()} cores, load avg {load()}; Python "
        f"{platform.python_version()}, torch {torch}; commit {commit()}; "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"
    )


def commit() -> str:
    """The checkout's commit, and the files changed since it (`-dirty` would not say which)."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
        return done.stdout.rstrip("\n")

    changed = [line[3:] for line in git("status", "--porcelain", "-uno").splitlines()]
    head = git("rev-parse", "--short", "HEAD") or "-"
    return head + (f" + uncommitted changes to {', '.join(changed)}" if changed else "")


@contextlib.contextmanager
def saved(name: str) -> Iterator[None]:
    """Print the header, tee stdout to bench/results/<name>.txt, print the load at the end."""
    keep = os.environ.get("BENCH_RESULTS", "1") != "0"
    RESULTS.mkdir(exist_ok=True)
    with contextlib.ExitStack() as stack:
        streams: list[TextIO] = [sys.stdout]
        if keep:
            streams.append(stack.enter_context((RESULTS / f"{name}.txt").open("w")))
        real, sys.stdout = sys.stdout, _Tee(*streams)  # type: ignore[assignment]
        try:
            script = os.path.relpath(sys.argv[0], ROOT)
            print("$ python " + " ".join([script, *sys.argv[1:]]))
            print(machine(), flush=True)
            try:
                yield
            finally:  # a bench that exits non-zero (a target missed) says it too
                print(f"# load avg at the end: {load()}", flush=True)
        finally:
            sys.stdout = real
