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

Each ratio is the ratio of the medians printed, with its 95% interval (paired bootstrap over
rounds).

`--watch` measures the watch instead: a DDP training step (a ~10 M-parameter MLP, 4 x
Linear(1600, 1600), batch 16, Adam) unwatched, watched every step (`diff_watch`, parameters
before each forward; `--optim`: also Adam's state after each step), and unwatched again (the
control), each a cell of 10 steps, interleaved in rounds whose order rotates. Each variant trains
a model of its own, identical to the others; the watches are set once, before the rounds, so a
cell times training steps only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from median_ci import ratio_of_medians

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
def make():
    torch.manual_seed(0)
    ddp = DDP(torch.nn.Sequential(*[torch.nn.Linear(1600, 1600) for _ in range(4)]))
    return ddp, torch.optim.Adam(ddp.parameters(), lr=1e-4)
def steps(ddp, opt, n=10):
    for _ in range(n):
        opt.zero_grad()
        ddp(torch.randn(16, 1600)).sum().backward()
        opt.step()
models = {name: make() for name in ("plain", "watched", "optim")}
ddp_watched, opt_watched = models["watched"]
ddp_optim, opt_optim = models["optim"]
for ddp, opt in models.values():
    steps(ddp, opt, 2)
"""


def interleaved(variants: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """Each variant's time in every round, the order rotating so that each goes first in turn."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            started = time.perf_counter()
            variants[name]()
            times[name].append(time.perf_counter() - started)
    return times


def table(times: dict[str, list[float]], base: str, unit: str, scale: float) -> None:
    """Median time (in `unit`: seconds times `scale`), the ratio of that median to `base`'s and
    its 95% interval; then the spread of the times (lowest-highest)."""
    print(f"{'variant':<14} {unit:>9}  vs {base} [95% CI]  spread")
    for name, values in times.items():
        ratio, low, high = ratio_of_medians(values, times[base])
        print(
            f"{name:<14} {statistics.median(values) * scale:>9.3f}  "
            f"{ratio:.3f}x [{low:.3f}-{high:.3f}]  "
            f"{min(values) * scale:.3f}-{max(values) * scale:.3f}"
        )


def bench_watch(rounds: int) -> None:
    with distnb.start(2, progress=False) as s:
        s.run(WATCH_SETUP)
        s.diff_watch("ddp_watched")  # watched for the whole run: each cell times steps only
        s.diff_watch("ddp_optim", optim="opt_optim")

        def cell(model: str) -> Callable[[], None]:
            return lambda: s.run(f"steps(*models[{model!r}])")

        variants = {
            "unwatched": cell("plain"),
            "watched": cell("watched"),
            "watched+optim": cell("optim"),
            "again": cell("plain"),
        }
        times = interleaved(variants, rounds)
        assert s.diff_report("ddp_watched").report.first is None  # each step was digested
    print(f"# DDP 10M MLP, Adam, 2 ranks: cells of 10 steps, {rounds} rounds")
    table(times, "unwatched", "ms/step", 1e3 / 10)


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
        assert s.diff("model", grads=True).agree
        variants = {
            "floor": lambda: s.run(FLOOR),
            "distnb": lambda: s.diff("model", grads=True),
            "megatron": lambda: s.run(MEGATRON),
        }
        times = interleaved(variants, args.rounds)
    print(f"# {params} parameters + their gradients on 2 ranks, {args.rounds} rounds")
    table(times, "floor", "median s", 1.0)


if __name__ == "__main__":
    main()
