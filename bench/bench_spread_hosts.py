"""The check among many hosts, rehearsed: single-rank hosts, each a network namespace with its own
sshd, network, host name and /dev/shm (`harness/hosts.py`), one distnb session across them over
ssh. What a checked 8-element all_reduce adds to the same all_reduce unchecked, at 4, 16 and 32
hosts, with the hosts' leaders agreeing both ways distnb has (`exchange/tiered.py`):

- `gather`: every leader posts its summary and reads every other's (below `SPREAD_HOSTS`);
- `spread`: dissemination, log2 H rounds of one read each (from `SPREAD_HOSTS` on).

Run:  sudo .venv/bin/python bench/bench_spread_hosts.py [--hosts 32] [--rounds 6] [--iters 20]

Each way is a process group of its own, made with `DISTNB_SPREAD_HOSTS` set so that it takes
that way (the switch is read when a group's exchange is made); the unchecked all_reduce runs on
the first of them inside `distnb.unchecked()`, `plain again` is the control. A round runs every
variant once, `iters` collectives each, the order rotated each round; a variant's time in a round
is the median over its collectives of the slowest rank's time. Printed per size: the unchecked
median, each variant's ratio of medians to it with a 95% interval, and the time it adds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from median_ci import ratio_of_medians  # noqa: E402
from results import saved  # noqa: E402

import distnb  # noqa: E402
from harness.hosts import Lan, missing  # noqa: E402

SIZES = (4, 16, 32)
WAYS = {"gather": 10**6, "spread": 2}  # DISTNB_SPREAD_HOSTS for each way
VARIANTS = ("plain", "plain again", "gather", "spread")

SETUP = """
import os, time
import distnb
from distnb.rank.checked.exchange import tiered
groups = {}
for n in SIZES:
    for way, spread in WAYS.items():
        os.environ[tiered.SPREAD_VAR] = str(spread)
        groups[n, way] = dist.new_group(list(range(n)))
        if rank < n:
            dist.all_reduce(torch.ones(8), group=groups[n, way])  # its exchange made here
os.environ.pop(tiered.SPREAD_VAR)
"""

MEASURE = """
times = []
if rank < {n}:
    g, x = groups[{n}, "gather" if {variant!r}.startswith("plain") else {variant!r}], torch.ones(8)
    for _ in range({iters}):
        t0 = time.perf_counter_ns()
        if {variant!r}.startswith("plain"):
            with distnb.unchecked():
                dist.all_reduce(x, group=g)
        else:
            dist.all_reduce(x, group=g)
        times.append(time.perf_counter_ns() - t0)
"""


def measure(session: distnb.Session, n: int, variant: str, iters: int) -> float:
    """The median over `iters` collectives of the slowest rank's time (ms)."""
    session.run(MEASURE.format(n=n, variant=variant, iters=iters))
    per_rank = session.pull("times", ranks=list(range(n)))
    return float(statistics.median(max(ts) for ts in zip(*per_rank, strict=True))) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    if why := missing():
        sys.exit(f"bench_spread_hosts needs {why}")
    sizes = [n for n in SIZES if n <= args.hosts]
    found: dict[tuple[int, str], list[float]] = {(n, v): [] for n in sizes for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="bench-spread-") as state:
        lan = Lan(Path(state), hosts=args.hosts)
        try:
            started = time.perf_counter()
            for h in range(args.hosts):
                lan.add_host(f"h{h + 2}")
            print(f"# {args.hosts} rehearsal hosts made in {time.perf_counter() - started:.1f} s")
            started = time.perf_counter()
            with distnb.start(
                hosts={h.addr: 1 for h in lan.hosts},
                host=lan.kernel_addr,
                ssh_args=lan.ssh_args,
                progress=False,
            ) as session:
                print(f"# a session of {args.hosts} ranks, one per host, started in "
                      f"{time.perf_counter() - started:.1f} s")  # fmt: skip
                setup = SETUP.replace("SIZES", repr(tuple(sizes))).replace("WAYS", repr(WAYS))
                session.run(setup)
                for r in range(args.rounds):
                    order = [(n, v) for n in sizes for v in VARIANTS]
                    k = r % len(order)
                    for n, v in order[k:] + order[:k]:
                        found[n, v].append(measure(session, n, v, args.iters))
        finally:
            lan.close()
    print(f"# {args.rounds} rounds x {args.iters} all_reduces of 8 floats per variant")
    print("hosts  plain ms  variant: x plain [95% CI] added")
    added: dict[tuple[int, str], float] = {}
    for n in sizes:
        plain = found[n, "plain"]
        cells = [f"{n:5d}", f"{statistics.median(plain):8.3f}"]
        for v in VARIANTS[1:]:
            ratio, low, high = ratio_of_medians(found[n, v], plain)
            added[n, v] = statistics.median(found[n, v]) - statistics.median(plain)
            cells.append(f"{v}: {ratio:.2f}x [{low:.2f}-{high:.2f}] {added[n, v]:+.2f} ms")
        print("  ".join(cells))
    for v in ("gather", "spread"):
        ratios = {n: statistics.median(found[n, v]) / statistics.median(found[n, "plain"])
                  for n in sizes}  # fmt: skip
        line = ", ".join(f"{n} hosts {ratios[n] / ratios[sizes[0]]:.2f}" for n in sizes[1:])
        print(f"{v}: ratio to plain against {sizes[0]} hosts' ratio: {line}")


if __name__ == "__main__":
    with saved("spread-hosts"):
        main()
