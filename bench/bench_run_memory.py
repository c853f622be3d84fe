"""What a rank keeps of each `%dist_run`: objects alive and resident size, run after run.

    python bench/bench_run_memory.py [--runs 8] [--off-first]

A run imports its libraries afresh (`distnb.rank.fresh.modules`); after it, the run's modules
are taken out and should be collected. Two 2-rank sessions, one after the other (what a run
leaves stays in its session), each running `harness/frameworks.py`'s Lightning fit once to warm
up and then `--runs` times, reading rank 0's live objects (after `gc.collect()`) and resident
size after each run:

- as shipped: the run's `atexit` handlers run at its end, its fork handlers are dropped,
  `typing`'s caches and overloads let go of its modules (`distnb.rank.fresh.hooks`,
  `modules._let_go`), and what its libraries patched into torch and `logging` gives way to the
  cells' (`distnb.rank.fresh.patches`: Lightning wraps `torch.compile`);
- release off (a private switch, for this bench only): the handlers stay registered, `typing`
  keeps what it made and the patches stay, as runs went before.

Rows: per variant, the growth per run (median of run-to-run differences, and its range) in
objects and MiB, the objects and size after the last run, and the median run time (the two
sessions run one after the other, so their times are not a paired comparison).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from results import saved

import distnb
from harness.frameworks import CASES

# The private switch: no handler run or unregistered, fork handlers registered for good,
# typing's caches left as they are, the patches of torch and logging left to the runs.
RELEASE_OFF = """\
import distnb.rank.fresh.modules as _m, distnb.rank.fresh.hooks as _h, distnb.rank.fresh.reset as _r
_r.PARTS = tuple(p for p in _r.PARTS if type(p).__name__ != "PatchesPart")
_r._joined = [(p, v) for p, v in _r._joined if p in _r.PARTS]
_m._let_go = lambda names: None
_end = _h.RunHooks.end
def _kept_all(self, dropped):
    self._exits = []
    _end(self, ())
_h.RunHooks.end = _kept_all
_h.RunHooks._register_at_fork = lambda self, **handlers: _h._register_at_fork(**handlers)
"""
READ = """\
import gc, psutil
gc.collect()
print(len(gc.get_objects()), psutil.Process().memory_info().rss / 2**20)
"""


def variant(script: Path, runs: int, off: bool) -> tuple[list[tuple[int, float]], list[float]]:
    """Rank 0's (objects, MiB) after each run, and each run's wall time."""
    s = distnb.start(2, progress=False)
    try:
        if off:
            s.run(RELEASE_OFF)
        read: list[tuple[int, float]] = []
        took: list[float] = []
        for n in range(runs + 1):
            quiet = io.StringIO()  # the ranks' output, shown as in a notebook
            with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
                started = time.perf_counter()
                s.run_script(str(script))
                if n:  # the first run imports what every run keeps
                    took.append(time.perf_counter() - started)
                objects, mib = s.run(READ, ranks=[0]).stdout(0).split()
            read.append((int(objects), float(mib)))
        return read, took
    finally:
        s.stop()


def row(label: str, read: list[tuple[int, float]], took: list[float]) -> str:
    objects = [b[0] - a[0] for a, b in itertools.pairwise(read)]
    mib = [b[1] - a[1] for a, b in itertools.pairwise(read)]
    return (
        f"{label:24} {statistics.median(objects):+9,.0f} ({min(objects):+,}..{max(objects):+,})"
        f"  {statistics.median(mib):+6.1f} ({min(mib):+.1f}..{max(mib):+.1f})"
        f"  {read[-1][0]:>9,} {read[-1][1]:7.0f}  {statistics.median(took):6.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--off-first", action="store_true", help="the release-off session first")
    args = parser.parse_args()
    with saved("run-memory"), tempfile.TemporaryDirectory(prefix="bench-run-memory-") as folder:
        script = Path(folder) / "lightning_fit.py"
        script.write_text(CASES["lightning_fit.py"].source)
        if args.off_first:
            off = variant(script, args.runs, off=True)
            shipped = variant(script, args.runs, off=False)
        else:
            shipped = variant(script, args.runs, off=False)
            off = variant(script, args.runs, off=True)
        first = "release off" if args.off_first else "as shipped"
        print(f"# rank 0 of 2, Lightning fit, {args.runs} runs after the first; {first} first")
        print(
            f"{'variant':24} {'objects a run (range)':>25}  {'MiB a run (range)':>19}"
            f"  {'objects':>9} {'MiB':>7}  {'run s':>6}"
        )
        print(row("as shipped", *shipped))
        print(row("release off", *off))


if __name__ == "__main__":
    main()
