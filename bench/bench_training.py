"""What checking costs on whole training steps: DDP, FSDP2 and a compiled DDP step, on gloo.

    python bench/bench_training.py [--quick] [--ranks 2]
    python bench/bench_training.py --models "DDP small MLP" --rounds 120

Each rank builds the models and times one optimizer step (forward, backward with its gradient
collectives, step) in modes that take turns in short rounds, each mode in every place of the
order in turn, as in `bench_collectives.py`. One set of ranks runs with distnb loaded:

- unloaded:  distnb's checked runtime not installed at all (`checked.uninstall()` for the turn,
             `checked.install` again after it, outside the timed steps): the baseline;
- again:     unloaded once more, in its own turn: the control, whose ratio to unloaded shows
             how far two runs of the same code differ here (the noise floor of every ratio);
- unchecked: distnb installed, its checks off (`distnb.unchecked()`): what being loaded costs;
- checked:   distnb's checked runtime, every collective of the step checked before it runs;
             printed against unloaded and against unchecked.

FSDP2 only, a second set of ranks, started with `TORCH_DISTRIBUTED_DEBUG=DETAIL` and without
distnb (building a DDP model at DETAIL level kills torch 2.13 with a segmentation fault in
`c10d::Logger::set_env_variables`, with or without distnb), holds the model twice:

- DETAIL's plain: the model on a process group made at debug level OFF (plain gloo), timed with
                  the debug level OFF: the baseline of DETAIL, in the same processes;
- DETAIL:         the model on the default group, made at DETAIL (torch wraps its gloo in
                  ProcessGroupWrapper), timed at DETAIL level.

Models: a small MLP (64-256-256-10, batch 32, 0.09 M parameters, one DDP bucket), a ~10 M
parameter MLP (4 x 1600x1600, batch 16, several buckets), FSDP2 (`fully_shard` per layer) of the
10 M model, and the small MLP under `torch.compile` (DDP's graph splitting per bucket).

A step's time is the slowest rank's; a round's figure for a mode is the median of its timed
steps; a mode's printed time is the median of its rounds' figures. Each ratio is the ratio of
two such printed medians (`ratio_of_medians`), so it always equals the quotient of the times
printed beside it; its 95% interval is a paired bootstrap over the rounds (a resampled round
keeps both modes' figures from that round). More `--rounds` narrow it. Not counted, and said so
in the output: one untimed step per model and mode when the ranks start (warm-up: buckets,
compiled graphs) and the first step of every turn (untimed, after the mode is switched, before
a barrier). No round is discarded.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from median_ci import ratio_of_medians  # noqa: E402  (bench/ is on the path when the bench runs)
from spawned import Spawned  # noqa: E402

PLAIN = "DETAIL's plain"
LOADED_MODES = ("unloaded", "again", "unchecked", "checked")  # the ranks with distnb
DETAIL_MODES = (PLAIN, "DETAIL")  # the ranks started at DETAIL level
DETAIL_MODELS = ("FSDP2 10M MLP",)  # see DETAIL above
# (mode, its baseline): the rows printed for each model; a baseline's own row has None
ROWS = (
    ("unloaded", None),
    ("again", "unloaded"),
    ("unchecked", "unloaded"),
    ("checked", "unloaded"),
    ("checked", "unchecked"),
    (PLAIN, None),
    ("DETAIL", PLAIN),
)
MODELS = ("DDP small MLP", "DDP 10M MLP", "FSDP2 10M MLP", "compiled DDP MLP")
# (steps per turn, rounds): full and --quick
PLAN = {
    "DDP small MLP": (20, 30),
    "DDP 10M MLP": (3, 16),
    "FSDP2 10M MLP": (3, 16),
    "compiled DDP MLP": (20, 30),
}
QUICK = {m: (max(1, s // 2), 4) for m, (s, _) in PLAN.items()}
SMALL, BIG = [64, 256, 256, 10], [1600] * 5


def _mlp(widths: list[int]) -> Any:
    import torch.nn as nn

    layers: list[Any] = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _fsdp(mesh: Any) -> Any:
    """The 10 M MLP sharded per layer over `mesh` (None: the default group's)."""
    import torch
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = _mlp(BIG)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _step(model: Any, batch: int, width: int) -> Callable[[], None]:
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width)

    def step() -> None:
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    return step


def _loaded_steps(models: list[str]) -> dict[str, Callable[[], None]]:
    """The steps of the ranks with distnb loaded, for the models asked for."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    builders: dict[str, Callable[[], tuple[Any, int, int]]] = {
        "DDP small MLP": lambda: (DDP(_mlp(SMALL)), 32, 64),
        "DDP 10M MLP": lambda: (DDP(_mlp(BIG)), 16, 1600),
        "FSDP2 10M MLP": lambda: (_fsdp(None), 16, 1600),
        "compiled DDP MLP": lambda: (torch.compile(DDP(_mlp(SMALL))), 32, 64),
    }
    steps = {}
    for name in models:
        torch.manual_seed(0)
        steps[name] = _step(*builders[name]())
    return steps


def _plain_mesh() -> Any:
    """A mesh over a group made at debug level OFF: plain gloo, beside the DETAIL default
    group, so that DETAIL's control runs in the same processes. Checked, not assumed."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    dist.set_debug_level(dist.DebugLevel.OFF)
    group = dist.new_group()
    dist.set_debug_level(dist.DebugLevel.DETAIL)
    cpu, world = torch.device("cpu"), dist.group.WORLD
    assert world is not None and group is not None
    assert type(group._get_backend(cpu)).__name__ == "ProcessGroupGloo"
    assert type(world._get_backend(cpu)).__name__ == "_ProcessGroupWrapper"
    return DeviceMesh.from_group(group, "cpu")


class _Rig:
    """The models of one rank and the modes it times them in (`LOADED_MODES` on ranks with
    distnb installed, `DETAIL_MODES` on ranks started at DETAIL level, where `plain` holds each
    model again on a group made at debug level OFF)."""

    def __init__(self, models: list[str], detail: bool, install: Callable[[], None]) -> None:
        self.install = install  # puts distnb back after an "unloaded" turn
        self.modes = DETAIL_MODES if detail else LOADED_MODES
        self.plain: dict[str, Callable[[], None]] = {}
        if detail:
            models = [m for m in models if m in DETAIL_MODELS]
            self.steps = {m: _step(_fsdp(None), 16, 1600) for m in models}
            mesh = _plain_mesh() if models else None
            self.plain = {m: _step(_fsdp(mesh), 16, 1600) for m in models}
        else:
            self.steps = _loaded_steps(models)
        for model in self.steps:  # warm up: buckets rebuilt, graphs compiled, in every mode
            for mode in self.modes:
                self.time_steps(model, mode, 0)

    def time_steps(self, model: str, mode: str, steps: int) -> list[int]:
        """`steps` timed steps of `model` in `mode`, after one untimed step and a barrier."""
        import torch.distributed as dist

        step = (self.plain if mode == PLAIN else self.steps)[model]
        with self._mode(mode):
            step()  # the turn's first step, untimed: the first after the switch
            dist.barrier()
            return [_timed(step) for _ in range(steps)]

    @contextlib.contextmanager
    def _mode(self, mode: str) -> Iterator[None]:
        """The process as `mode` needs it; the switches are outside the timed steps."""
        import torch.distributed as dist

        from distnb.rank import checked

        if mode in ("unloaded", "again"):
            checked.uninstall()
            try:
                yield
            finally:
                self.install()
        elif mode == "unchecked":
            with checked.unchecked():
                yield
        elif mode == PLAIN:
            dist.set_debug_level(dist.DebugLevel.OFF)
            try:
                yield
            finally:
                dist.set_debug_level(dist.DebugLevel.DETAIL)
        else:  # checked, DETAIL: as the ranks were started
            yield


def _timed(step: Callable[[], None]) -> int:
    t0 = time.perf_counter_ns()
    step()
    return time.perf_counter_ns() - t0


def _worker(
    rank: int, world: int, port: int, models: list[str], detail: bool, conn: Connection
) -> None:
    warnings.simplefilter("ignore")
    os.environ.update(OMP_NUM_THREADS="1")
    if detail:  # read when torch.distributed is imported
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    import torch
    import torch.distributed as dist

    from distnb.rank import checked

    torch.set_num_threads(1)
    client = dist.TCPStore("127.0.0.1", port, None, False, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group(
        "gloo", store=dist.PrefixStore("pg", client), rank=rank, world_size=world
    )

    def install() -> None:
        store = dist.PrefixStore("check", client)
        checked.install(store, rank=rank, world_size=world, session_id=f"bt{port}")

    if not detail:
        install()
    rig = _Rig(models, detail, install)
    conn.send("ready")
    while (request := conn.recv()) is not None:
        conn.send(rig.time_steps(**request))
    checked.uninstall()
    dist.destroy_process_group()


class Ranks(Spawned):
    def __init__(self, world: int, models: list[str], detail: bool = False) -> None:
        super().__init__(world, _worker, models, detail)

    def time(self, model: str, mode: str, steps: int) -> list[int]:
        """Each timed step's time on the slowest rank, ns."""
        per_rank = self.request({"model": model, "mode": mode, "steps": steps})
        return [max(ts) for ts in zip(*per_rank, strict=True)]


def _order(modes: tuple[str, ...], r: int) -> tuple[str, ...]:
    """Round r's order: rotated by one each round, reversed every other cycle, so each mode
    takes every place and follows every other mode in turn."""
    k = r % len(modes)
    order = modes[k:] + modes[:k]
    return order if r // len(modes) % 2 == 0 else order[::-1]


def run_rounds(
    ranks: Ranks, detail: Ranks | None, model: str, steps: int, rounds: int
) -> dict[str, list[float]]:
    """mode -> its figure in each round (the median of its timed steps, slowest rank, ms)."""
    modes = LOADED_MODES + DETAIL_MODES if detail and model in DETAIL_MODELS else LOADED_MODES
    per_round: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(rounds):
        for mode in _order(modes, r):
            procs = detail if detail and mode in DETAIL_MODES else ranks
            per_round[mode].append(statistics.median(procs.time(model, mode, steps)) / 1e6)
    return per_round


def report(world: int, model: str, per_round: dict[str, list[float]]) -> None:
    """One row per (mode, baseline) in `ROWS`: the mode's median over rounds and, but for a
    baseline's own row, the ratio of the two printed medians with its 95% interval."""
    for mode, base in ROWS:
        if mode not in per_round:
            continue
        ms = statistics.median(per_round[mode])
        if base is None:
            ratio = f"{'(baseline)':>24}"
        else:
            r, low, high = ratio_of_medians(per_round[mode], per_round[base])
            ratio = f"{r:9.2f}x [{low:.2f}-{high:.2f}]"
        row = f"{world:>5} | {model:<17} | {mode:<14} | {ms:8.2f} | {ratio:>24} | {base or ''}"
        print(row.rstrip())


def _header(plan: dict[str, tuple[int, int]], models: list[str]) -> None:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{os.cpu_count()} cores, load avg {load}; {time.ctime()}")
    print(
        "step ms: per round, the median over the turn's timed steps of the slowest rank's time;\n"
        "printed, the median of those per-round figures over the rounds.\n"
        "ratio = mode's printed median / its baseline's printed median (column 'to'); [its 95%\n"
        "interval: paired bootstrap over rounds, 2,000 resamplings, 2.5th-97.5th percentiles].\n"
        "Baselines: unloaded (distnb not installed) for again, unchecked and checked; checked\n"
        f"also to unchecked; DETAIL to {PLAIN} (the same step in DETAIL's own processes, on a\n"
        "group made at debug level OFF, timed at level OFF)."
    )
    for model in models:
        steps, rounds = plan[model]
        print(f"{model}: {rounds} rounds x {steps} timed steps per mode and round")
    print(
        "Not counted: 1 untimed warm-up step per model and mode when the ranks start, and the\n"
        "first step of every turn (untimed, before a barrier). No round is discarded.\n"
    )
    ratio = "ratio [95% interval]"
    print(f"ranks | {'model':<17} | {'mode':<14} | {'step ms':>8} | {ratio:>24} | to")


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
    models = list(args.models)
    _header(plan, models)
    for world in args.ranks:
        ranks = Ranks(world, models)
        needs_detail = any(m in DETAIL_MODELS for m in models)
        detail = Ranks(world, models, detail=True) if needs_detail else None
        try:
            for model in models:
                steps, rounds = plan[model]
                report(world, model, run_rounds(ranks, detail, model, steps, rounds))
                sys.stdout.flush()
        finally:
            ranks.close()
            if detail:
                detail.close()


if __name__ == "__main__":
    from results import saved

    with saved("training"):
        main()
