"""What the debugger on the ranks costs when no breakpoint is hit.

    python bench/bench_debug.py [--rounds 30] [--runs 10]

The kernel's side of the debugger is its desk: while a cell runs, every wake of the wait loop
reads the control plane's prompt counter (one store round trip) to find ranks that ask for
input. The ranks' side is two cell hooks and a character count on their output streams. Three
variants run on one 2-rank cluster, interleaved in rounds:

- `no desk`: the same session with the desk's polling switched off in the kernel (the ranks'
  hooks stay: they cannot be told apart from the engine's own per-cell work);
- `desk`: as shipped;
- `no desk again`: the first variant once more, the control for the machine's noise.

Each round rotates the order of the variants, so none always runs first.

Workloads, each a `session.run` as `%%allranks` does it: an empty cell; a cell of 200 checked
8-element `all_reduce`s; a cell that sleeps 0.3 s (its wait loop wakes about 6 times). Each
round times `--runs` runs of each variant and keeps their median; the printed times are the
medians of those over rounds, and each ratio is the quotient of two printed times with its 95%
interval (paired bootstrap over rounds, `median_ci.ratio_of_medians`).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from median_ci import ratio_of_medians

import distnb
from distnb.session.debugger.desk import Desk

WORKLOADS = {
    "empty cell": "",
    "200 all_reduce (8 el)": ("x = torch.ones(8)\nfor _ in range(200):\n    dist.all_reduce(x)"),
    "cell of 0.3 s": "import time\ntime.sleep(0.3)",
}
VARIANTS = ("no desk", "desk", "no desk again")


def timed(session: distnb.Session, code: str, runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        session.run(code)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    serve = Desk.serve
    results: dict[tuple[str, str], list[float]] = {}
    with distnb.start(2, progress=False) as session:
        for code in WORKLOADS.values():
            timed(session, code, 3)  # warm: imports, first collectives
        for r in range(args.rounds):
            for name, code in WORKLOADS.items():
                for variant in VARIANTS[r % 3 :] + VARIANTS[: r % 3]:  # each goes first in turn
                    Desk.serve = serve if variant == "desk" else (lambda self, run: 0.0)  # type: ignore[method-assign]
                    results.setdefault((name, variant), []).append(timed(session, code, args.runs))
        Desk.serve = serve  # type: ignore[method-assign]
    print(f"# python {platform.python_version()}, {args.rounds} rounds x {args.runs} runs")
    print(f"{'workload':<24} {'no desk ms':>10} {'desk ms':>9}  desk/no desk [95% CI]   control")
    for name in WORKLOADS:
        base, desk, again = (results[(name, v)] for v in VARIANTS)
        ratio, low, high = ratio_of_medians(desk, base)
        control, c_low, c_high = ratio_of_medians(again, base)
        print(
            f"{name:<24} {statistics.median(base) * 1e3:>10.2f} "
            f"{statistics.median(desk) * 1e3:>9.2f}  "
            f"{ratio:.3f}x [{low:.3f}-{high:.3f}]   {control:.3f}x [{c_low:.3f}-{c_high:.3f}]"
        )


if __name__ == "__main__":
    main()
