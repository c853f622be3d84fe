"""What the collection a rank makes once a run has replied saves the run after it.

    python bench/bench_run_idle.py [--rounds 6] [--pause 1.0]

A run's modules, taken out at its end, are garbage that only a full collection frees
(`distnb.rank.fresh.modules`); the rank makes it once the run has replied and it is idle. Without
it, the imports of the next run set one off. One warm 2-rank session runs
`harness/frameworks.py`'s Lightning fit again and again, `--pause` seconds apart (a user reading
the output; a run sent within 0.05 s of the last one's reply waits for the collection instead).
Each run is labelled by whether the run before it collected once idle: as shipped, or not (a
private switch on the ranks, for this bench only), with a second as-shipped label as the control;
each round has one run of each label, in an order that rotates from round to round. Per label:
the run's wall time (the median over rounds and the range), and rank 0's full collections during
the run (how many, and their time), read with `gc.callbacks`. Last, the time of rank 0's
collection once idle.
"""

from __future__ import annotations

import argparse
import contextlib
import io
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

# Rank-side: the switch, and the full collections timed (`during` the run, `idle` after it).
SETUP = """\
import gc as _gc, time as _time
import distnb.rank.fresh.modules as _modules
_shipped = _modules._collect
_full = {"during": [], "idle": []}
_started = []
def _timed(phase, info):
    if info["generation"] != 2:
        return
    if phase == "start":
        _started.append(_time.perf_counter())
    elif _started:
        _full["idle" if _idle[0] else "during"].append(_time.perf_counter() - _started.pop())
_idle = [False]
def _collect_timed():
    _idle[0] = True
    try:
        _shipped()
    finally:
        _idle[0] = False
_gc.callbacks.append(_timed)
"""
SWITCH = "_modules._collect = _collect_timed if {on} else (lambda: None)"
READ = """\
print(len(_full["during"]), sum(_full["during"]), *_full["idle"])
_full["during"].clear(); _full["idle"].clear()
"""
LABELS = ("as shipped", "no collection when idle", "as shipped (control)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--pause", type=float, default=1.0)
    args = parser.parse_args()
    with saved("run-idle"), tempfile.TemporaryDirectory(prefix="bench-run-idle-") as folder:
        script = Path(folder) / "lightning_fit.py"
        script.write_text(CASES["lightning_fit.py"].source)
        took: dict[str, list[float]] = {label: [] for label in LABELS}
        during: dict[str, list[tuple[int, float]]] = {label: [] for label in LABELS}
        idle: list[float] = []
        s = distnb.start(2, progress=False)
        try:
            s.run(SETUP)
            order = [LABELS[(r + i) % 3] for r in range(args.rounds) for i in range(3)]
            # a run's own label says what it does at its end; it is timed under the label of the
            # run before it. The first run imports what every run keeps, the second is timed
            # under none.
            for k, label in enumerate([LABELS[0], *order, LABELS[0]]):
                s.run(SWITCH.format(on=label != LABELS[1]))
                time.sleep(args.pause)
                quiet = io.StringIO()  # the ranks' output, shown as in a notebook
                with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
                    started = time.perf_counter()
                    s.run_script(str(script))
                    wall = time.perf_counter() - started
                    time.sleep(args.pause)  # the collection once idle, if any, is over
                    count, seconds, *idled = s.run(READ, ranks=[0]).stdout(0).split()
                if k >= 2:
                    took[order[k - 2]].append(wall)
                    during[order[k - 2]].append((int(count), float(seconds)))
                idle += [float(x) for x in idled]
        finally:
            s.stop()
        print(
            f"# rank 0 of 2, Lightning fit, {args.rounds} rounds, {args.pause:g} s between runs;"
            " each run labelled by what the run before it did"
        )
        print(f"{'the run before':26} {'run s (range)':>20}  {'full collections in the run':>30}")
        for label in LABELS:
            runs, collections = took[label], during[label]
            counts = [c for c, _ in collections]
            seconds = [t for _, t in collections]
            print(
                f"{label:26} {statistics.median(runs):6.2f} ({min(runs):.2f}-{max(runs):.2f})"
                f"  {sum(counts):>3} in {len(counts)} runs,"
                f" {statistics.median(seconds):.2f} s a run ({min(seconds):.2f}-{max(seconds):.2f})"
            )
        shipped, off, control = (statistics.median(took[label]) for label in LABELS)
        print(f"no collection when idle / as shipped: {off / shipped:.2f}")
        print(f"control / as shipped (noise floor): {control / shipped:.2f}")
        print(
            f"rank 0's collection once idle: median {statistics.median(idle):.2f} s"
            f" ({min(idle):.2f}-{max(idle):.2f}), {len(idle)} collections"
        )


if __name__ == "__main__":
    main()
