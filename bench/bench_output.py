"""What a change to the cell path costs: this checkout's distnb against another version's.

    python bench/bench_output.py [--before main] [--cells 200]

The version at git ref BEFORE is extracted with `git archive`; each version runs a session in a
process of its own (`cell_worker.py`) whose stdout is a terminal, as in terminal IPython, where
ranks' lines are printed as they come. Each version runs two sessions: sessions of the same code
differ by several per cent on this machine, so each version's time in a round is the mean of its
two, and each pair of same-code sessions is a control (its ratio is the noise floor). Cells:
empty (`%%allranks` with nothing in it), one that works and prints nothing, one that prints a
line on each rank. In rounds of one cell of each kind on each of the four sessions, the
sessions' order rotated round by round, paired per round, after warm-up rounds that are not
counted. Times and ratios as in `bench_session.py`:
medians with 95% intervals (`median_ci`), ratios of medians with a paired bootstrap interval.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pty
import shutil
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_session import WARMUP_ROUNDS, _row  # bench/ is on the path, as above
from results import saved


class _Worker:
    """`cell_worker.py` on the distnb found at `path`, its stdout and stderr a terminal (read
    and dropped here), its times coming back on a pipe."""

    def __init__(self, path: str) -> None:
        self.master, terminal = pty.openpty()
        reply, write_end = os.pipe()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                os.path.join(os.path.dirname(__file__), "cell_worker.py"),
                str(write_end),
            ],
            stdin=subprocess.PIPE,
            stdout=terminal,
            stderr=terminal,
            pass_fds=(write_end,),
            env={**os.environ, "PYTHONPATH": path},
            text=True,
        )
        os.close(terminal)
        os.close(write_end)
        threading.Thread(target=_drain, args=(self.master,), daemon=True).start()
        self.replies = os.fdopen(reply)
        self.distnb = self.replies.readline().strip()  # once its session has started
        if not self.distnb.startswith(path):
            raise RuntimeError(f"the worker for {path} imported distnb from {self.distnb!r}")

    def run(self, kind: str) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write(kind + "\n")
        self.proc.stdin.flush()
        return float(self.replies.readline())

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.replies.close()


def _drain(fd: int) -> None:
    """Read a terminal's output until it closes (a full terminal would block the writer)."""
    with contextlib.suppress(OSError):
        while os.read(fd, 65536):
            pass


def version_times(before: str, rounds: int) -> tuple[dict[str, dict[str, list[float]]], str]:
    """session -> kind -> each round's cell time (s), for two sessions of this checkout's distnb
    ("after", "after'") and two of git ref `before` ("before", "before'"), each in a worker of
    its own. A round runs one cell of each kind on each session, the sessions' order rotated
    round by round; warm-up rounds are not counted."""
    from cell_worker import CELLS

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    old = tempfile.mkdtemp(prefix="bench-before-")
    archive = subprocess.run(
        ["git", "-C", root, "archive", before, "distnb"], check=True, capture_output=True
    )
    subprocess.run(["tar", "-x", "-C", old], input=archive.stdout, check=True)
    commit = subprocess.run(
        ["git", "-C", root, "rev-parse", "--short", before],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    paths = {"before": old, "after": root, "before'": old, "after'": root}
    workers: dict[str, _Worker] = {}
    times: dict[str, dict[str, list[float]]] = {side: {k: [] for k in CELLS} for side in paths}
    try:
        for side, path in paths.items():
            workers[side] = _Worker(path)
        names = list(workers)
        for r in range(-WARMUP_ROUNDS, rounds):
            for kind in CELLS:
                for side in names[r % 4 :] + names[: r % 4]:
                    t = workers[side].run(kind)
                    if r >= 0:
                        times[side][kind].append(t)
    finally:
        for worker in workers.values():
            worker.close()
        shutil.rmtree(old, ignore_errors=True)
    return times, commit


def _mean(a: list[float], b: list[float]) -> list[float]:
    """Round by round, the mean of two sessions' times."""
    return [(x + y) / 2 for x, y in zip(a, b, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", default="main", help="the git ref to compare with")
    parser.add_argument("--cells", type=int, default=200, help="rounds of one cell of each kind")
    args = parser.parse_args()
    with saved("output"):
        measure(args.before, args.cells)


def measure(before: str, rounds: int) -> None:
    times, commit = version_times(before, rounds)
    print(
        f"# {rounds} rounds of one cell of each kind on each of 4 sessions (order rotated), paired"
        f" per round; {WARMUP_ROUNDS} warm-up rounds not counted. after: this checkout; before:"
        f" {before} ({commit}); two sessions of each, each in a process of its own whose stdout"
        " is a terminal (ranks' lines printed as they come). after/before: each round's mean of"
        " a version's two sessions; controls: one session against the other of the same code."
    )
    print(f"{'measure':42} {'distnb':>26} {'peer':>26} {'ratio':>20}  peer")
    labels = {
        "empty": "empty cell",
        "quiet": "cell printing nothing",
        "prints": "cell, 1 line/rank",
    }
    for kind, label in labels.items():
        t = {side: values[kind] for side, values in times.items()}
        after, old = _mean(t["after"], t["after'"]), _mean(t["before"], t["before'"])
        print(_row(f"{label} (ms), after", after, old, 1e3, "before"))
        print(_row(f"{label} (ms), control", t["before'"], t["before"], 1e3, "before, 2 sessions"))
        print(_row(f"{label} (ms), control", t["after'"], t["after"], 1e3, "after, 2 sessions"))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
