"""What the collection a rank makes once a run has replied saves the run after it.

    python bench/bench_run_idle.py [--rounds 6] [--pause 1.0]

A run's modules, taken out at its end, are garbage that only a full collection frees
(`distnb.rank.fresh.modules`); the rank makes it once the run has replied and it is idle. Without
it, the imports of the next run set one off. Nothing is made ahead here (`distnb.rank.ahead`):
each run imports Lightning, as a script run once does. One warm 2-rank session runs
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
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from chained import chained_runs
from results import saved

import distnb
from harness.frameworks import CASES

# Rank-side: the switch, and the full collections timed (`during` the run, `idle` after it).
# Each run imports Lightning itself: the script run again gets no imports made ahead
# (`distnb.rank.ahead`, measured by bench_run_ahead.py), which would leave it nothing to import.
SETUP = """\
import gc as _gc, time as _time
import distnb.rank.ahead as _ahead, distnb.rank.fresh.modules as _modules
_ahead.when_idle = lambda *args: None
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
            for run in chained_runs(s, str(script), LABELS, args.rounds, args.pause, SWITCH, READ):
                count, spent, *idled = run.read.split()
                if run.timed_under is not None:
                    took[run.timed_under].append(run.wall_s)
                    during[run.timed_under].append((int(count), float(spent)))
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
