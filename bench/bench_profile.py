"""What `%%allranks --profile` / `%dist_profile` cost a rank: per step while on, once per profile
(start, collect), and nothing once off.

Run:  .venv/bin/python bench/bench_profile.py [--rounds N] [--steps K]
      .venv/bin/python bench/bench_profile.py --part scale [--sizes 8x20,32x20,8x80] [--repeat R]
      .venv/bin/python bench/bench_profile.py --part memory [--long S]

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

`--part scale` (saved as `profile-scale`): the kernel's side of `%dist_profile --report` on real
gloo sessions of 8 and 32 ranks, each training a small model (`SCALE_SETUP`: Linear 256 -> 256
-> 8, a DataLoader of 20 batches a `train()`, every gradient all_reduced; rank 1's Dataset
sleeps 25 ms an item, so there is a straggler to find) under `Session.profile(steps=K)`: 8 x 20,
32 x 20 and 8 x 80 ranks x steps (the last two the same ranks x steps). Each is profiled
`--repeat` times; the parts are timed one by one as `profile_report` runs them: `collect`
(every rank's profiler stopped and its spans brought to the kernel), `events` (the collective
records of the profiled cells), the `judgement` (`slowness.breakdown`, in `ProfileView`), the
view as `text` and `HTML`, and the Perfetto `export` (a file). With them: the bytes moved (the
pickled `RankProfile`s and events, as ipyparallel sends them), the spans, and the kernel's peak
of Python memory over the judgement, the views and the export (`tracemalloc`, a run of its
own). The analysis (judgement to export) is then run again on the last profile of each size,
`--rounds` rounds, the sizes' order rotated each round, for its medians.

`--part memory` (saved as `profile-memory`): what a rank keeps while armed without a step limit:
one process runs the `6x256` loop for `--long` steps plain, then armed (`arm()` with no limit,
one window), and reads its RSS every 250 steps; the growth per step of each (least squares) and
the `collect` of the long profile (its time, spans, dropped).
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

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


SCALE_SETUP = """
import time
from torch.utils.data import DataLoader, Dataset
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

class Items(Dataset):
    def __len__(self):
        return 80
    def __getitem__(self, i):
        if rank == 1:
            time.sleep(0.025)
        return torch.randn(256)

def train():
    for x in DataLoader(Items(), batch_size=4):
        model(x).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()
"""
SIZES = ((8, 20), (32, 20), (8, 80))  # ranks x steps; a session per number of ranks
PARTS = ("collect", "events", "judgement", "text", "HTML", "export")
ANALYSIS = PARTS[2:]


@dataclass
class Taken:
    """One size's profiles, kept for the analysis rounds, and its measures."""

    ranks: int
    steps: int
    times: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PARTS})
    profiles: list[Any] = field(default_factory=list)
    events: list[Any] = field(default_factory=list)
    profile_bytes: int = 0
    event_bytes: int = 0
    train_s: float = 0.0
    start_s: float = 0.0
    verdict: str = ""

    @property
    def name(self) -> str:
        return f"{self.ranks} ranks x {self.steps} steps"

    def median(self, parts: Sequence[str]) -> float:
        return sum(statistics.median(self.times[p]) for p in parts)


def analyse(t: Taken, folder: str) -> None:
    """The kernel's analysis of one profile, each part timed (what `profile_report` runs)."""
    from distnb.views.profiling import ProfileView

    clock = time.perf_counter()
    view = ProfileView(t.profiles, t.events, {}, 0)
    t.times["judgement"].append(time.perf_counter() - clock)
    clock = time.perf_counter()
    repr(view)
    t.times["text"].append(time.perf_counter() - clock)
    clock = time.perf_counter()
    view._repr_html_()
    t.times["HTML"].append(time.perf_counter() - clock)
    clock = time.perf_counter()
    view.export_chrome_trace(os.path.join(folder, f"{t.ranks}x{t.steps}.json"))
    t.times["export"].append(time.perf_counter() - clock)
    t.verdict = view.result.verdict


def take(n: int, steps: Sequence[int], repeat: int, folder: str) -> list[Taken]:
    """Start `n` ranks; profile each number of `steps` `repeat` times (a cell of 20 steps a
    train()), timing the collect and one analysis each time."""
    import distnb
    from distnb.rank import profiling, runtime

    out = [Taken(n, k) for k in steps]
    clock = time.perf_counter()
    with distnb.start(n, progress=False) as s:
        started = time.perf_counter() - clock
        s.run(SCALE_SETUP)
        s.run("train()")  # warm: the first DataLoader, the process group's first collectives
        for _ in range(repeat):
            for t in out:
                t.start_s = started
                s.profile(steps=t.steps)
                clock = time.perf_counter()
                s.run(f"for _ in range({-(-t.steps // 20)}):\n    train()")
                t.train_s = time.perf_counter() - clock
                clock = time.perf_counter()
                profiles = [p for p in s.call(profiling.collect) if p is not None]
                t.times["collect"].append(time.perf_counter() - clock)
                clock = time.perf_counter()
                runs = [r for p in profiles for r in p.runs if r]
                events = [e for per in s.call(runtime.events, min(runs)) for e in per]
                t.times["events"].append(time.perf_counter() - clock)
                t.profiles, t.events = profiles, events
                analyse(t, folder)
    for t in out:
        t.profile_bytes = len(pickle.dumps(t.profiles, pickle.HIGHEST_PROTOCOL))
        t.event_bytes = len(pickle.dumps(t.events, pickle.HIGHEST_PROTOCOL))
    return out


def peak_bytes(t: Taken, folder: str) -> int:
    """The kernel's peak of Python allocations over one analysis (judgement to export)."""
    tracemalloc.start()
    try:
        analyse(t, folder)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def scale(sizes: Sequence[tuple[int, int]], repeat: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as folder:
        taken: list[Taken] = []
        for n in dict.fromkeys(n for n, _ in sizes):
            taken += take(n, [k for m, k in sizes if m == n], repeat, folder)
        for r in range(rounds):  # the analysis again, the sizes' order rotated each round
            for t in taken[r % len(taken) :] + taken[: r % len(taken)]:
                analyse(t, folder)
        peaks = {t.name: peak_bytes(t, folder) for t in taken}
        trace = {
            t.name: os.path.getsize(os.path.join(folder, f"{t.ranks}x{t.steps}.json"))
            for t in taken
        }
    print("%dist_profile --report, its parts timed in the kernel, after Session.profile(steps=K)")
    for t in taken:
        spans = sum(len(p.spans) for p in t.profiles)
        per = t.ranks * t.steps
        print(
            f"\n{t.name}: {t.ranks} ranks started in {t.start_s:.1f} s; the profiled cell took "
            f"{t.train_s:.1f} s; {spans} spans ({spans / per:.1f} a rank and step), "
            f"{len(t.events)} collective records"
        )
        print(
            f"  moved to the kernel: profiles {t.profile_bytes / 1e6:.2f} MB "
            f"({t.profile_bytes / per / 1e3:.1f} kB a rank and step), "
            f"events {t.event_bytes / 1e6:.2f} MB; Perfetto trace {trace[t.name] / 1e6:.2f} MB"
        )
        for part in PARTS:
            ms = sorted(x * 1e3 for x in t.times[part])
            print(
                f"  {part:<10} {statistics.median(ms):>8.1f} ms "
                f"(spread {ms[0]:.1f}-{ms[-1]:.1f}, {len(ms)} runs)"
            )
        print(
            f"  in all     {t.median(PARTS) * 1e3:>8.1f} ms, of which the analysis "
            f"{t.median(ANALYSIS) * 1e3:.1f} ms ({t.median(ANALYSIS) / per * 1e6:.0f} us a rank "
            "and step)"
        )
        print(f"  the analysis' peak of Python memory: {peaks[t.name] / 1e6:.1f} MB")
        print(f"  verdict: {t.verdict}")
    base = taken[0]
    for t in taken[1:]:
        work = (t.ranks * t.steps) / (base.ranks * base.steps)
        print(f"\n{t.name} against {base.name} ({work:.0f}x the ranks x steps):")
        print(
            "  "
            + ", ".join(
                f"{part} {t.median(of) / base.median(of):.2f}x"
                for part, of in (*((p, (p,)) for p in PARTS), ("analysis", ANALYSIS))
            )
        )


def rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def slope(points: Sequence[tuple[int, int]]) -> float:
    """Least-squares growth of y per x."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)


def memory(long: int, every: int = 250) -> None:
    w = WORKLOADS[0]
    run = loop(w, every)
    run()
    curves: dict[str, list[tuple[int, int]]] = {}
    for variant in ("plain", "armed", "plain again"):
        if variant == "armed":
            profiling.arm()
            armed = profiling._armed
            assert armed is not None
            armed._pre()
        points = [(0, rss())]
        for done in range(every, long + 1, every):
            run()
            points.append((done, rss()))
        curves[variant] = points
        if variant == "armed":
            armed = profiling._armed
            assert armed is not None
            armed._post()
            began = time.perf_counter()
            profile = profiling.collect()
            took = time.perf_counter() - began
            assert profile is not None
            kept, dropped = len(profile.spans), profile.dropped
            after = rss()
    print(f"{w.title}: one process, {long} steps a variant, RSS read every {every} steps")
    for variant, points in curves.items():
        grown = (points[-1][1] - points[0][1]) / 1e6
        print(
            f"  {variant:<12} {slope(points) / 1e3:>8.1f} kB a step ({grown:+.1f} MB over {long})"
        )
    print(
        f"  collect of the armed {long} steps: {took:.2f} s, {kept} spans kept, {dropped} dropped "
        f"(bound {profiling.MAX_SPANS}); RSS after it "
        f"{(after - curves['armed'][-1][1]) / 1e6:+.1f} MB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("cost", "scale", "memory"), default="cost")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--cells", type=int, default=20, help="rounds of the session's cells")
    parser.add_argument(
        "--sizes", default=",".join(f"{n}x{k}" for n, k in SIZES), help="--part scale: RANKSxSTEPS"
    )
    parser.add_argument("--repeat", type=int, default=3, help="--part scale: profiles a size")
    parser.add_argument("--long", type=int, default=2000, help="--part memory: steps a variant")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.part == "scale":
        with saved("profile-scale"):
            sizes = [tuple(map(int, x.split("x"))) for x in args.sizes.split(",")]
            scale([(n, k) for n, k in sizes], args.repeat, args.rounds)
        return
    if args.part == "memory":
        with saved("profile-memory"):
            memory(args.long)
        return
    with saved("profile"):
        print(f"torch {torch.__version__}, 1 thread, CPU; wall time per training step")
        for w in WORKLOADS:
            bench(w, args.rounds, args.steps)
        session_cells(args.cells)


if __name__ == "__main__":
    main()
