"""What `%%allranks --profile` / `%dist_profile` cost a rank: per step while on, once per profile
(start, collect), and nothing once off.

Run:  .venv/bin/python bench/bench_profile.py [--rounds N] [--steps K]

In one process, with one torch thread, on the CPU, the rank's side of profiling
(`distnb.rank.profiling`: the profiler, the modules' forward hooks, the optimizer's step hook)
around a training loop: a DataLoader over a TensorDataset, a model, `backward`, SGD's `step` and
`zero_grad`. Workloads:

- `6x256`: Linear+GELU 6 x 256, batch 64: many small ops, where a cost per op shows;
- `mlp`: 4 x [512 -> 1024 -> 512], batch 128: fewer, bigger ops.

Variants, each K steps a round:

- `plain`: nothing armed; `plain again`: the same, the control: its figure is the noise;
- `profiled`: armed before the round, the steps inside one window (a cell), collected after;
- `after`: plain steps after a profile was collected: what remains once profiling is off.

And on a 2-rank session (gloo), what `%%allranks --profile` adds to a cell as the kernel sees
it: a cell of one all_reduce run plain and with `profile=True` (arm, the cell, collect, the
collective records, the view), rounds interleaved as above; and the first profile of the
session's ranks, which starts kineto in each rank's process (once per process).

Timing: a round runs every variant once, the order rotated by one place each round, so that a
busy neighbour slows them all alike. Each variant first runs its K steps once untimed: the first
loop after other work (another variant, a profile's collect) runs on cold caches, some 25%
slower on `6x256` here whether or not anything was profiled, which would be charged to whichever
variant comes next (`after`, mostly, without it). Wall time (`perf_counter`) of the K steps
per variant; the overhead in a round is a variant's time less `plain`'s in that round. Printed
per variant: the median step time over the rounds, the median overhead per step, the ratio of
medians to `plain` with a 95% interval (paired bootstrap over rounds, `ratio_of_medians`). Per
profile, outside the steps: `start` (the profiler started, the clock markers) and `collect`
(the profiler stopped, its events read into spans), medians with their spread (min-max), and the
spans kept per step.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from median_ci import ratio_of_medians  # bench/ is on the path when the bench runs
from results import saved
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from distnb.rank import profiling

VARIANTS = ("plain", "plain again", "profiled", "after")


@dataclass(frozen=True)
class Workload:
    key: str
    title: str
    layers: Callable[[], list[nn.Module]]
    width: int
    batch: int


def gelu_stack() -> list[nn.Module]:
    return [m for _ in range(6) for m in (nn.Linear(256, 256), nn.GELU())]


def mlp() -> list[nn.Module]:
    return [m for _ in range(4) for m in (nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 512))]


WORKLOADS = (
    Workload("6x256", "Linear+GELU 6 x 256, batch 64", gelu_stack, 256, 64),
    Workload("mlp", "MLP (4 x [512->1024->512]), batch 128", mlp, 512, 128),
)


@dataclass
class Times:
    steps: dict[str, list[float]] = field(default_factory=lambda: {v: [] for v in VARIANTS})
    start: list[float] = field(default_factory=list)
    collect: list[float] = field(default_factory=list)
    spans: list[float] = field(default_factory=list)


def loop(w: Workload, k: int) -> Callable[[], None]:
    model = nn.Sequential(*w.layers())
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = TensorDataset(
        torch.randn(w.batch * k, w.width, generator=torch.Generator().manual_seed(0))
    )

    def run() -> None:
        for (x,) in DataLoader(data, batch_size=w.batch):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()

    return run


def one(variant: str, run: Callable[[], None], k: int, t: Times) -> None:
    run()  # untimed: the first loop after other work runs on cold caches (see the docstring)
    if variant != "profiled":
        began = time.perf_counter()
        run()
        t.steps[variant].append((time.perf_counter() - began) / k)
        return
    began = time.perf_counter()
    profiling.arm()
    armed = profiling._armed
    assert armed is not None
    armed._pre()  # what the engine's pre_run_cell hook does: the profiler starts, a window opens
    t.start.append(time.perf_counter() - began)
    began = time.perf_counter()
    run()
    t.steps[variant].append((time.perf_counter() - began) / k)
    armed._post()
    began = time.perf_counter()
    profile = profiling.collect()
    t.collect.append(time.perf_counter() - began)
    assert profile is not None
    t.spans.append(len(profile.spans) / k)


def bench(w: Workload, rounds: int, k: int) -> None:
    run = loop(w, k)
    t = Times()
    for _ in range(3):  # warm up: the first profile loads kineto
        for v in VARIANTS:
            one(v, run, k, Times())
    for r in range(rounds):
        order = VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]
        for v in order:
            one(v, run, k, t)
    print(f"\n{w.title}: {rounds} rounds x {k} steps")
    print(f"  {'variant':<12}{'step ms':>9}{'+ms':>8}{'x plain [95% CI]':>24}")
    base = t.steps["plain"]
    for v in VARIANTS:
        med = statistics.median(t.steps[v]) * 1e3
        if v == "plain":
            print(f"  {v:<12}{med:>9.3f}")
            continue
        extra = statistics.median(a - b for a, b in zip(t.steps[v], base, strict=True)) * 1e3
        ratio, lo, hi = ratio_of_medians(t.steps[v], base)
        print(f"  {v:<12}{med:>9.3f}{extra:>8.3f}{ratio:>10.2f}x [{lo:.2f}-{hi:.2f}]")
    for name, values in (("start", t.start), ("collect", t.collect)):
        ms = sorted(x * 1e3 for x in values)
        spread = f"spread {ms[0]:.2f}-{ms[-1]:.2f} ms"
        print(f"  {name} per profile: {statistics.median(ms):.2f} ms ({spread})")
    print(f"  spans kept per step: {statistics.median(t.spans):.1f}")


CELL = "x = torch.ones(4)\ndist.all_reduce(x)"


def session_cells(rounds: int) -> None:
    import distnb

    with distnb.start(2, progress=False) as s:
        s.run(CELL)
        began = time.perf_counter()
        s.run(CELL, profile=True)
        first = time.perf_counter() - began
        times: dict[bool, list[float]] = {False: [], True: []}
        for r in range(rounds):
            for flag in (False, True) if r % 2 == 0 else (True, False):
                began = time.perf_counter()
                s.run(CELL, profile=flag)
                times[flag].append(time.perf_counter() - began)
    plain, profiled = (sorted(x * 1e3 for x in times[f]) for f in (False, True))
    extra = statistics.median(a - b for a, b in zip(times[True], times[False], strict=True))
    ratio, lo, hi = ratio_of_medians(times[True], times[False])
    print(f"\n2-rank session, a cell of one all_reduce: {rounds} rounds")
    for name, ms in (("plain", plain), ("--profile", profiled)):
        spread = f"spread {ms[0]:.1f}-{ms[-1]:.1f} ms"
        print(f"  {name:<10} {statistics.median(ms):.1f} ms per cell ({spread})")
    print(f"  --profile adds {extra * 1e3:.1f} ms a cell: {ratio:.2f}x [{lo:.2f}-{hi:.2f}]")
    print(
        f"  the session's first --profile cell: {first * 1e3:.0f} ms (kineto starts on each rank)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--cells", type=int, default=20, help="rounds of the session's cells")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with saved("profile"):
        print(f"torch {torch.__version__}, 1 thread, CPU; wall time per training step")
        for w in WORKLOADS:
            bench(w, args.rounds, args.steps)
        session_cells(args.cells)


if __name__ == "__main__":
    main()
