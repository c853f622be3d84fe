"""What a script's imports made ahead, while the ranks wait, save the run of it after them.

    python bench/bench_run_ahead.py [--rounds 6] [--pause 1.0]

Once a script run again has replied and no cell has come for 0.1 s, each rank runs the script's
leading imports as the next run would start them, and that run starts after them
(`distnb.rank.ahead`). One warm 2-rank session runs `harness/frameworks.py`'s Lightning fit,
transformers Trainer's fit and Accelerate's fit again and again, `--pause` seconds apart (a
user reading the output; a run sent sooner waits for the imports, then starts after them).
Each run is labelled by whether the run before it made the next one's imports
ahead: as shipped, or not (a private switch on the ranks, for this bench only), with a second
as-shipped label as the control; each round has one run of each label for each script, in an
order that rotates from round to round. Per label and script: the run's wall time (the median
over rounds, and the range). Last, the time rank 0 spent on each script's imports made ahead,
and on the full collection after them, while it waited.
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

# Rank-side: the switch, and the time of the imports made ahead and of the collection after.
SETUP = """\
import time as _time
import distnb.rank.ahead as _ahead, distnb.rank.fresh.modules as _modules
_shipped, _make, _collect = _ahead.when_idle, _ahead._make, _modules._collect
_idle = {"ahead": [], "collection": []}
def _timed(name, work):
    def timed(*args):
        started = _time.perf_counter()
        try:
            work(*args)
        finally:
            _idle[name].append(_time.perf_counter() - started)
    return timed
_ahead._make = _timed("ahead", _make)
_modules._collect = _timed("collection", _collect)
"""
SWITCH = "_ahead.when_idle = _shipped if {on} else (lambda *args: None)"
READ = """\
print(sum(_idle["ahead"]), sum(_idle["collection"]))
_idle["ahead"].clear(); _idle["collection"].clear()
"""
LABELS = ("as shipped", "nothing made ahead", "as shipped (control)")
SCRIPTS = {
    "Lightning": "lightning_fit.py",
    "Trainer": "trainer_fit.py",
    "Accelerate": "accelerate_fit.py",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--pause", type=float, default=1.0)
    args = parser.parse_args()
    with saved("run-ahead"), tempfile.TemporaryDirectory(prefix="bench-run-ahead-") as folder:
        paths = {}
        for framework, name in SCRIPTS.items():
            paths[framework] = Path(folder) / name
            paths[framework].write_text(CASES[name].source)
        took: dict[tuple[str, str], list[float]] = {(f, x): [] for f in SCRIPTS for x in LABELS}
        idle: dict[str, list[tuple[float, float]]] = {f: [] for f in SCRIPTS}
        s = distnb.start(2, progress=False)
        try:
            s.run(SETUP)
            for framework, script in paths.items():
                for run in chained_runs(
                    s, str(script), LABELS, args.rounds, args.pause, SWITCH, READ
                ):
                    if run.timed_under is not None:
                        took[framework, run.timed_under].append(run.wall_s)
                    if run.label != LABELS[1] and run.timed_under is not None:
                        ahead_s, collection_s = run.read.split()
                        idle[framework].append((float(ahead_s), float(collection_s)))
        finally:
            s.stop()
        print(
            f"# 2 ranks, {args.rounds} rounds, {args.pause:g} s between runs; each run labelled"
            " by what the run before it did"
        )
        print(f"{'script':12} {'the run before':24} {'run s (range)':>20}")
        for framework in SCRIPTS:
            for label in LABELS:
                runs = took[framework, label]
                print(
                    f"{framework:12} {label:24} {statistics.median(runs):6.2f}"
                    f" ({min(runs):.2f}-{max(runs):.2f})"
                )
        for framework in SCRIPTS:
            shipped, off, control = (statistics.median(took[framework, x]) for x in LABELS)
            print(f"{framework}: nothing made ahead / as shipped: {off / shipped:.2f}")
            print(f"{framework}: control / as shipped (noise floor): {control / shipped:.2f}")
        for framework in SCRIPTS:
            made = [m for m, _ in idle[framework]]
            collected = [c for _, c in idle[framework]]
            print(
                f"{framework}: rank 0 once idle: imports made ahead {statistics.median(made):.2f} s"
                f" ({min(made):.2f}-{max(made):.2f}), the collection after them"
                f" {statistics.median(collected):.2f} s ({min(collected):.2f}-{max(collected):.2f})"
            )


if __name__ == "__main__":
    main()
