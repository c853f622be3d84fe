"""What checking costs on whole training steps: DDP, FSDP2 and a compiled DDP step, on gloo.

    python bench/bench_training.py [--quick] [--ranks 2]
    python bench/bench_training.py --models "DDP small MLP" --rounds 120

Each rank builds the models once and times one optimizer step (forward, backward with its
gradient collectives, step) in four modes that take turns in short rounds, each mode in every
place of the order in turn, as in `bench_collectives.py`:

- unchecked: torch as is (`distnb.unchecked()`: distnb's kernels pass every call through);
- again:     unchecked once more, in its own turn: the control, whose ratio shows the noise;
- checked:   distnb's checked runtime, every collective of the step checked before it runs;
- DETAIL:    the same model in a second set of ranks started with
             `TORCH_DISTRIBUTED_DEBUG=DETAIL` (torch's ProcessGroupWrapper), without distnb;
             FSDP2 only: building a DDP model at DETAIL level kills torch 2.13 with a
             segmentation fault (in `c10d::Logger::set_env_variables`, with or without distnb).

Models: a small MLP (64-256-256-10, batch 32, 0.09 M parameters, one DDP bucket), a ~10 M
parameter MLP (4 x 1600x1600, batch 16, several buckets), FSDP2 (`fully_shard` per layer) of the
10 M model, and the small MLP under `torch.compile` (DDP's graph splitting per bucket). The
figure is the median step time of the slowest rank; a ratio is the median over rounds of that
round's median against unchecked in the same round, given with the 95% confidence interval of
that median (order statistics): more `--rounds` narrow it.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import os
import statistics
import sys
import time
import warnings
from multiprocessing.connection import Connection
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from median_ci import median_ci  # noqa: E402  (bench/ is on the path when the bench runs)
from spawned import Spawned  # noqa: E402

MODES = ("unchecked", "again", "checked", "DETAIL")
DETAIL_MODELS = ("FSDP2 10M MLP",)  # see DETAIL above
MODELS = ("DDP small MLP", "DDP 10M MLP", "FSDP2 10M MLP", "compiled DDP MLP")
# (steps per turn, rounds): full and --quick
PLAN = {
    "DDP small MLP": (20, 30),
    "DDP 10M MLP": (3, 16),
    "FSDP2 10M MLP": (3, 16),
    "compiled DDP MLP": (20, 30),
}
QUICK = {m: (max(1, s // 2), 4) for m, (s, _) in PLAN.items()}


def _mlp(widths: list[int]) -> Any:
    import torch.nn as nn

    layers: list[Any] = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class _Rig:
    """The models of one rank (at DETAIL level, only those torch can build there)."""

    def __init__(self, detail: bool) -> None:
        import torch
        from torch.distributed.fsdp import fully_shard
        from torch.nn.parallel import DistributedDataParallel as DDP

        self.steps: dict[str, Any] = {}
        small, big = [64, 256, 256, 10], [1600] * 5
        if not detail:
            torch.manual_seed(0)
            self._add("DDP small MLP", DDP(_mlp(small)), 32, 64)
            torch.manual_seed(0)
            self._add("DDP 10M MLP", DDP(_mlp(big)), 16, 1600)
            torch.manual_seed(0)
            self._add("compiled DDP MLP", torch.compile(DDP(_mlp(small))), 32, 64)
        torch.manual_seed(0)
        fsdp = _mlp(big)
        for layer in fsdp:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(fsdp)
        self._add("FSDP2 10M MLP", fsdp, 16, 1600)
        with _unchecked():
            for step in self.steps.values():
                step()  # warm up: buckets rebuilt, graphs compiled

    def _add(self, name: str, model: Any, batch: int, width: int) -> None:
        import torch

        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        x = torch.randn(batch, width)

        def step() -> None:
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()

        self.steps[name] = step

    def time_steps(self, model: str, mode: str, steps: int) -> list[int]:
        import torch.distributed as dist

        step = self.steps[model]
        times = []
        with _unchecked() if mode != "checked" else _Nothing():
            step()
            dist.barrier()
            for _ in range(steps):
                t0 = time.perf_counter_ns()
                step()
                times.append(time.perf_counter_ns() - t0)
        return times


def _unchecked() -> Any:
    from distnb.rank import checked

    return checked.unchecked()


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _worker(rank: int, world: int, port: int, detail: bool, conn: Connection) -> None:
    warnings.simplefilter("ignore")
    os.environ.update(OMP_NUM_THREADS="1")
    if detail:  # read when the process group is made
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    import torch
    import torch.distributed as dist

    from distnb.rank import checked

    torch.set_num_threads(1)
    client = dist.TCPStore("127.0.0.1", port, None, False, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group(
        "gloo", store=dist.PrefixStore("pg", client), rank=rank, world_size=world
    )
    if not detail:
        store = dist.PrefixStore("check", client)
        checked.install(store, rank=rank, world_size=world, session_id=f"bt{port}")
    rig = _Rig(detail)
    conn.send("ready")
    while (request := conn.recv()) is not None:
        conn.send(rig.time_steps(**request))
    checked.uninstall()
    dist.destroy_process_group()


class Ranks(Spawned):
    def __init__(self, world: int, detail: bool = False) -> None:
        super().__init__(world, _worker, detail)

    def time(self, model: str, mode: str, steps: int) -> list[int]:
        per_rank = self.request({"model": model, "mode": mode, "steps": steps})
        return [max(ts) for ts in zip(*per_rank, strict=True)]


def measure(
    ranks: Ranks, detail: Ranks, model: str, steps: int, rounds: int
) -> dict[str, tuple[float, float, float, float]]:
    """mode -> (median step ms, ratio to unchecked, the 95% confidence interval of that
    median ratio over rounds), modes rotated round by round."""
    modes = MODES if model in DETAIL_MODELS else MODES[:-1]
    per_mode: dict[str, list[int]] = {m: [] for m in modes}
    per_round: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(rounds):
        k = r % len(modes)
        order = modes[k:] + modes[:k]
        for mode in order if r // len(modes) % 2 == 0 else order[::-1]:
            times = (detail if mode == "DETAIL" else ranks).time(model, mode, steps)
            per_mode[mode] += times
            per_round[mode].append(statistics.median(times))
    base = per_round["unchecked"]
    found = {}
    for m in modes:
        ratios = [a / b for a, b in zip(per_round[m], base, strict=True)]
        low, high = median_ci(ratios)
        found[m] = (statistics.median(per_mode[m]) / 1e6, statistics.median(ratios), low, high)
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=MODELS, metavar="MODEL")
    parser.add_argument("--rounds", type=int, help="rounds per model (default: the plan's)")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else PLAN
    if args.rounds:
        plan = {m: (steps, args.rounds) for m, (steps, _) in plan.items()}
    print("$ python " + " ".join([os.path.relpath(__file__, ROOT), *(argv or sys.argv[1:])]))
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{os.cpu_count()} cores, load avg {load}; {time.ctime()}")
    print(
        "median step of the slowest rank, ms; ratio to unchecked: median of per-round ratios "
        "[its 95% confidence interval]\n"
    )
    cols = " | ".join(f"{m:>25}" for m in MODES)
    print(f"ranks | {'model':<17} | {cols}")
    for world in args.ranks:
        ranks, detail = Ranks(world), Ranks(world, detail=True)
        try:
            for model in args.models:
                steps, rounds = plan[model]
                found = measure(ranks, detail, model, steps, rounds)
                cells = " | ".join(
                    f"{found[m][0]:7.2f} {found[m][1]:.2f}x [{found[m][2]:.2f}-{found[m][3]:.2f}]"
                    if m in found
                    else f"{'-':>25}"
                    for m in MODES
                )
                print(f"{world:>5} | {model:<17} | {cells}", flush=True)
        finally:
            ranks.close()
            detail.close()


if __name__ == "__main__":
    main()
