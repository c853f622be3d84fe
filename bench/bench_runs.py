"""What a `%dist_run` costs on a running session, against torchrun, and what its reset adds.

    python bench/bench_runs.py [--rounds 9] [--resets 200]

Each round runs every trial once, in an order that rotates from round to round, all on one
warm 2-rank session (this process plays the kernel):

- `%dist_run` of a small DDP script (`init_process_group`, a DDP `Linear(4, 1)`, 4 steps,
  `destroy_process_group`; the one bench_faults.py uses), as shipped: each run in a process
  made to look as a fresh torchrun worker's (`distnb.rank.fresh`);
- the same with that reset switched off on the ranks (a private switch, for this bench only:
  runs then go as they did before the reset existed), twice per round, in separate turns: the
  second is the control, its ratio to the first the noise floor;
- the same script under `torchrun --standalone --nproc-per-node 2` (process starts, imports,
  rendezvous, exit; a run lost to gloo's exit-time abort is run again and counted);
- an empty cell (`session.run("pass")`), the floor any run pays;
- Accelerate's `test_cli.py` with and without the reset: a script that imports a library,
  which a run with the reset imports afresh each time (the price of fresh singletons).

Each rank also times the reset alone: `--resets` times entering and leaving `fresh.as_fresh()`
with nothing inside, in one cell: the median wall time, the least, and the median CPU time of
the rank's main thread (what the reset itself costs, whatever the machine's load). Once before
the rounds, when the cells have imported nothing since the join, and once after them, when the
cells have imported Accelerate (the more modules cells hold, the more a run sets aside).
Last, memory: each rank's resident size before and after `--memory-runs` more runs of
`test_cli.py` (each imports Accelerate afresh; the copy before is left to the garbage collector).
Rows: medians with the 95% interval of the median (order statistics); ratios of medians with a
paired-bootstrap interval.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from bench_faults import SCRIPT
from median_ci import median_ci, ratio_of_medians
from results import saved
from torchrun_timed import torchrun_seconds

import distnb
from harness.thirdparty import script_path

ROWS = {
    "fresh": "%dist_run, DDP script (reset as shipped)",
    "plain": "%dist_run, DDP script, reset off",
    "control": "%dist_run, DDP script, reset off (control)",
    "torchrun": "torchrun --standalone, 2 ranks: DDP script",
    "empty": "empty cell",
    "lib_fresh": "%dist_run, Accelerate's test_cli.py (reset)",
    "lib_plain": "%dist_run, Accelerate's test_cli.py, reset off",
}
# The private switch: the ranks' remembered state, put aside (reset off) or back (reset on).
RESET_OFF = "import distnb.rank.fresh.reset as _f\n_f._bench_kept = _f._joined\n_f._joined = None"
RESET_ON = "import distnb.rank.fresh.reset as _f\n_f._joined = _f._bench_kept"
RSS = "import psutil\nprint(psutil.Process().memory_info().rss / 2**20)"
TIME_RESET = """\
import time, statistics, distnb.rank.fresh as _f
_wall, _cpu = [], []
for _ in range({n}):
    _t, _c = time.perf_counter(), time.thread_time()
    with _f.as_fresh():
        pass
    _wall.append(time.perf_counter() - _t)
    _cpu.append(time.thread_time() - _c)
print(statistics.median(_wall) * 1000, min(_wall) * 1000, statistics.median(_cpu) * 1000)
"""


class Bench:
    def __init__(self, folder: Path) -> None:
        self.script = folder / "train.py"
        self.script.write_text(SCRIPT)
        self.s = distnb.start(2, progress=False)
        self.times: dict[str, list[float]] = {key: [] for key in ROWS}
        self.reruns = 0

    def run(self, path: Path, *args: str) -> float:
        out = io.StringIO()
        started = time.perf_counter()
        with contextlib.redirect_stdout(out):  # the ranks' output, shown as in a notebook
            self.s.run_script(str(path), list(args))
        return time.perf_counter() - started

    def without_reset(self, timed: Callable[[], float]) -> float:
        self.s.run(RESET_OFF)
        try:
            return timed()
        finally:
            self.s.run(RESET_ON)


def fresh(b: Bench) -> None:
    b.times["fresh"].append(b.run(b.script, "--steps", "4"))


def plain(b: Bench) -> None:
    b.times["plain"].append(b.without_reset(lambda: b.run(b.script, "--steps", "4")))


def control(b: Bench) -> None:
    b.times["control"].append(b.without_reset(lambda: b.run(b.script, "--steps", "4")))


def empty(b: Bench) -> None:
    started = time.perf_counter()
    b.s.run("pass")
    b.times["empty"].append(time.perf_counter() - started)


def library(b: Bench) -> None:
    cli = script_path("test_cli.py")
    b.times["lib_fresh"].append(b.run(cli))
    b.times["lib_plain"].append(b.without_reset(lambda: b.run(cli)))


def torchrun(b: Bench) -> None:
    took, lost = torchrun_seconds(b.script)
    b.times["torchrun"].append(took)
    b.reruns += lost


TRIALS = (fresh, plain, torchrun, empty, control, library)


def time_reset(b: Bench, n: int) -> str:
    """The reset alone on each rank: median wall ms (least), median CPU ms of its thread."""
    timed = b.s.run(TIME_RESET.format(n=n))
    return "; ".join(
        "rank {}: {:.2f} ms wall (min {:.2f}), {:.2f} ms CPU".format(
            r, *map(float, timed.stdout(r).split())
        )
        for r in (0, 1)
    )


def grown(b: Bench, runs: int) -> str:
    """Each rank's resident size before and after `runs` runs that import Accelerate."""
    before = b.s.run(RSS)
    for _ in range(runs):
        b.run(script_path("test_cli.py"))
    after = b.s.run(RSS)
    sizes = [(float(before.stdout(r)), float(after.stdout(r))) for r in (0, 1)]
    return "; ".join(
        f"rank {r}: {x:.0f} -> {y:.0f} MiB ({(y - x) / runs:+.2f} MiB a run)"
        for r, (x, y) in enumerate(sizes)
    )


def report(b: Bench, rounds: int, resets: dict[str, str]) -> None:
    print(f"{'run (s)':50} {'median':>7} {'95% CI':>15} {'min-max':>15}")
    for key, label in ROWS.items():
        times = b.times[key]
        low, high = median_ci(times)
        print(
            f"{label:50} {statistics.median(times):7.3f} {low:7.3f}-{high:<7.3f} "
            f"{min(times):7.3f}-{max(times):.3f}"
        )
    pairs = (
        ("torchrun / %dist_run", "torchrun", "fresh", "{:.0f}x [95% CI {:.0f}-{:.0f}]"),
        ("%dist_run / reset off, DDP script", "fresh", "plain", "{:.2f} [95% CI {:.2f}-{:.2f}]"),
        ("control / reset off (noise floor)", "control", "plain", "{:.2f} [95% CI {:.2f}-{:.2f}]"),
        ("%dist_run / reset off, Accelerate", "lib_fresh", "lib_plain", "{:.2f} [{:.2f}-{:.2f}]"),
        ("%dist_run / empty cell", "fresh", "empty", "{:.2f} [95% CI {:.2f}-{:.2f}]"),
    )
    for label, top, base, form in pairs:
        print(f"{label}: " + form.format(*ratio_of_medians(b.times[top], b.times[base])))
    print(f"torchrun runs lost to gloo's exit-time abort and run again: {b.reruns} of {rounds}")
    for state, times in resets.items():
        print(f"the reset alone, entering and leaving as_fresh(), {state}: {times}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--resets", type=int, default=200)
    parser.add_argument("--memory-runs", type=int, default=30)
    args = parser.parse_args()
    with saved("runs"):
        measure(args.rounds, args.resets, args.memory_runs)


def measure(rounds: int, resets_n: int, memory_runs: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-runs-") as folder:
        b = Bench(Path(folder))
        try:
            b.run(b.script)  # the first run after the start imports what every run keeps
            b.run(script_path("test_cli.py"))
            resets = {"cells imported nothing": time_reset(b, resets_n)}
            for r in range(rounds):
                shift = r % len(TRIALS)
                for trial in TRIALS[shift:] + TRIALS[:shift]:  # each goes first in turn
                    trial(b)
            b.s.run("import accelerate.utils")
            resets["cells imported Accelerate"] = time_reset(b, resets_n)
            memory = grown(b, memory_runs)
        finally:
            b.s.stop()
    print(f"# {rounds} rounds, each trial once per round in rotating order")
    report(b, rounds, resets)
    print(f"resident size of each rank over {memory_runs} more runs of test_cli.py: {memory}")


if __name__ == "__main__":
    main()
