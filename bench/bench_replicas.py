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
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=6)
    args = parser.parse_args()
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
