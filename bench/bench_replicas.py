"""Replica checks: how long `%dist_diff model --grads` takes on a ~100 M-parameter model.

    python bench/bench_replicas.py [--rounds 5] [--width 4096] [--layers 6]

Three ways to learn whether 2 ranks hold the same parameters and gradients, each timed from the
kernel as one cell-sized request, interleaved in rounds whose order rotates:

- `floor`: a plain read of the same tensors on each rank (`t.sum()`, in their own dtype): what
  any check of every byte must at least cost;
- `distnb`: `session.diff("model", grads=True)`: digests on each rank, sent back through the
  session, compared in the kernel;
- `megatron`: Megatron-LM's method (`check_param_hashes_across_dp_replicas`): SHA-1 of each
  parameter's bytes on the CPU, the hashes all-gathered over the process group and compared.

Ratios are medians over rounds of each round's ratio to the floor, with the 95% interval.

`--watch` measures the watch instead: a DDP training step (a ~10 M-parameter MLP, 4 x
Linear(1600, 1600), batch 16, Adam) unwatched, watched every step (`diff_watch`, parameters
before each forward; `--optim`: also Adam's state after each step), and unwatched again (the
control), each a cell of 5 steps, interleaved in rounds whose order rotates.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from median_ci import median_ci

import distnb

SETUP = """\
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear({width}, {width}) for _ in range({layers})])
model(torch.randn(4, {width})).sum().backward()
tensors = [t for p in model.parameters() for t in (p, p.grad)]
"""
FLOOR = "sums = [t.sum() for t in tensors]"
MEGATRON = """\
import hashlib
hashes = [hashlib.sha1(t.detach().cpu().numpy().tobytes()).digest() for t in tensors]
mine = torch.tensor([list(h) for h in hashes], dtype=torch.uint8)
every = [torch.empty_like(mine) for _ in range(world_size)]
dist.all_gather(every, mine)
agree = all(torch.equal(every[0], e) for e in every)
"""


WATCH_SETUP = """\
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(0)
net = torch.nn.Sequential(*[torch.nn.Linear(1600, 1600) for _ in range(4)])
ddp = DDP(net)
opt = torch.optim.Adam(ddp.parameters(), lr=1e-4)
def steps(n=5):
    for _ in range(n):
        opt.zero_grad()
        ddp(torch.randn(16, 1600)).sum().backward()
        opt.step()
steps(2)
"""


def bench_watch(rounds: int) -> None:
    with distnb.start(2, progress=False) as s:
        s.run(WATCH_SETUP)

        def watched(optim: str | None) -> Any:
            def run() -> float:
                s.diff_watch("ddp", optim=optim)
                started = time.perf_counter()
                s.run("steps()")
                elapsed = time.perf_counter() - started
                s.diff_stop("ddp")
                return elapsed

            return run

        def plain() -> float:
            started = time.perf_counter()
            s.run("steps()")
            return time.perf_counter() - started

        variants = {"unwatched": plain, "watched": watched(None), "watched+optim": watched("opt")}
        variants["again"] = plain
        times: dict[str, list[float]] = {name: [] for name in variants}
        names = list(variants)
        for r in range(rounds):
            for name in names[r % 4 :] + names[: r % 4]:
                times[name].append(variants[name]())
    print(f"# DDP 10M MLP, Adam, 2 ranks: cells of 5 steps, {rounds} rounds")
    print(f"{'variant':<14} {'ms/step':>8}  vs unwatched [95% CI]")
    for name in names:
        ratios = [t / u for t, u in zip(times[name], times["unwatched"])]
        low, high = median_ci(ratios)
        print(
            f"{name:<14} {statistics.median(times[name]) / 5 * 1e3:>8.1f}  "
            f"{statistics.median(ratios):.3f}x [{low:.3f}-{high:.3f}]"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--watch", action="store_true", help="the watch's cost on training")
    args = parser.parse_args()
    if args.watch:
        return bench_watch(args.rounds)
    with distnb.start(2, progress=False) as s:
        s.run(SETUP.format(width=args.width, layers=args.layers))
        params = s.run("sum(p.numel() for p in model.parameters())").result(0)
        variants = {
            "floor": lambda: s.run(FLOOR),
            "distnb": lambda: s.diff("model", grads=True),
            "megatron": lambda: s.run(MEGATRON),
        }
        assert s.diff("model", grads=True).agree
        times: dict[str, list[float]] = {name: [] for name in variants}
        names = list(variants)
        for r in range(args.rounds):
            for name in names[r % 3 :] + names[: r % 3]:
                started = time.perf_counter()
                variants[name]()
                times[name].append(time.perf_counter() - started)
    print(f"# {params} parameters + their gradients on 2 ranks, {args.rounds} rounds")
    print(f"{'variant':<10} {'median s':>9}  vs floor [95% CI]")
    for name in names:
        ratios = [t / f for t, f in zip(times[name], times["floor"])]
        low, high = median_ci(ratios)
        print(
            f"{name:<10} {statistics.median(times[name]):>9.3f}  "
            f"{statistics.median(ratios):.2f}x [{low:.2f}-{high:.2f}]"
        )


if __name__ == "__main__":
    main()
