"""Benchmark the overflow tracer against transformers' DebugUnderflowOverflow (DUO).

Run:  .venv/bin/python bench/bench_overflow.py [--quick]

A small T5 (random weights, built from a config: no download) and an MLP, on CPU, one thread;
the same inputs for every variant. One step = forward + backward + zero_grad. Each variant runs on
its own copy of the model with its hooks attached throughout; rounds run one step of each, in a
shuffled order, so that a busy neighbour slows them all alike. Variants:

- base:   no hooks;
- DUO:    `DebugUnderflowOverflow(model)`: forward hooks only (inputs, outputs, own weights);
- distnb: `distnb.overflow.watch(model, stats=...)` for each of `auto` (default), `fast`, `full`:
          forward (inputs, outputs, own weights) + backward (gradient into each module output)
          + each parameter's `.grad`. So distnb watches about twice as many tensors as DUO.

Target: distnb's overhead <= 0.25x DUO's, i.e. (distnb - base) / (DUO - base) <= 0.25.

Host syncs per step are counted in a separate, untimed pass, through a `TorchFunctionMode` that
counts every tensor method that hands a value to Python: `item`, `tolist`, `__format__` (DUO's
f-strings of 0-d tensors), `__bool__`, `__float__`, `__int__`, `numpy`, `cpu`. DUO makes 4 per
tensor: two `__format__` (abs min, abs max) and two `.item()` (isnan/isinf `any`). On CPU these
do not wait for a device, so the counts are what they would cost on a GPU, where each one stalls
the launch queue.
"""

from __future__ import annotations

import argparse
import copy
import random
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

import distnb.overflow as overflow

READBACKS = {
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.__format__,
    torch.Tensor.__bool__,
    torch.Tensor.__float__,
    torch.Tensor.__int__,
    torch.Tensor.numpy,
    torch.Tensor.cpu,
}


class CountReadbacks(TorchFunctionMode):
    """Counts calls that move a tensor's value to the host (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in READBACKS:
            self.n += 1
        return func(*args, **(kwargs or {}))


def t5_model() -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(  # type: ignore[call-arg]
        vocab_size=512,
        d_model=256,
        d_ff=1024,
        d_kv=32,
        num_layers=2,
        num_heads=8,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    model = T5ForConditionalGeneration(cfg)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 512, (4, 64), generator=g)
    labels = torch.randint(1, 512, (4, 32), generator=g)
    return model, lambda m: m(input_ids=ids, labels=labels).loss


def mlp_model() -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(512, 1024), nn.GELU(), nn.Dropout(0.1), nn.Linear(1024, 512)]
    model = nn.Sequential(*layers)
    x = torch.randn(128, 512, generator=torch.Generator().manual_seed(0))
    return model, lambda m: m(x).square().mean()


def step(model: nn.Module, loss_of: Callable[[nn.Module], torch.Tensor]) -> None:
    loss_of(model).backward()  # type: ignore[no-untyped-call]
    model.zero_grad(set_to_none=True)


class Variant:
    """One way of running the model, on its own copy of it, hooks attached for the whole run."""

    def __init__(self, name: str, model: nn.Module) -> None:
        self.name, self.model = name, model
        self.times: list[float] = []
        self.cpu: list[float] = []


def make_variants(model: nn.Module) -> list[Variant]:
    from transformers.debug_utils import DebugUnderflowOverflow

    duo = copy.deepcopy(model)
    DebugUnderflowOverflow(duo)  # type: ignore[no-untyped-call]  # hooks stay: its own copy
    variants = [Variant("base", model), Variant("DUO", duo)]
    for stats in ("auto", "fast", "full"):
        ours = copy.deepcopy(model)
        overflow.watch(ours, stats=stats)
        variants.append(Variant(f"distnb {stats}", ours))
    return variants


def time_variants(
    variants: list[Variant], loss_of: Callable[[nn.Module], torch.Tensor], rounds: int
) -> None:
    """One step of each variant per round, in a shuffled order: a busy neighbour or a cold cache
    then costs every variant alike."""
    for v in variants:
        for _ in range(3):  # warm up; `auto` learns which tensors need more statistics
            step(v.model, loss_of)
    order = list(variants)
    rnd = random.Random(0)
    for _ in range(rounds):
        rnd.shuffle(order)
        for v in order:
            t0, c0 = time.perf_counter(), time.thread_time()
            step(v.model, loss_of)
            v.cpu.append(time.thread_time() - c0)
            v.times.append(time.perf_counter() - t0)


def readbacks_per_step(v: Variant, loss_of: Callable[[nn.Module], torch.Tensor]) -> float:
    n_steps = 4
    counter = CountReadbacks()
    with counter:
        for _ in range(n_steps):
            step(v.model, loss_of)
    return counter.n / n_steps


def bench(name: str, build: Callable[[], Any], rounds: int) -> dict[str, float]:
    torch.manual_seed(0)
    model, loss_of = build()
    variants = make_variants(model)
    time_variants(variants, loss_of, rounds)
    cpu = {v.name: statistics.median(v.cpu) * 1e3 for v in variants}
    wall = {v.name: statistics.median(v.times) * 1e3 for v in variants}
    n_params = sum(p.numel() for p in model.parameters())
    print(f"\n{name}: {n_params / 1e6:.2f} M parameters, {rounds} timed steps per variant")
    print(
        f"  {'variant':12s} {'CPU ms':>8s} {'+ms':>7s} {'vs DUO':>7s}"
        f" {'wall ms':>8s} {'+ms':>7s} {'vs DUO':>7s} {'syncs/step':>11s}"
    )
    for v in variants:
        cells = [f"  {v.name:12s}"]
        for med in (cpu, wall):
            over = med[v.name] - med["base"]
            ratio = over / (med["DUO"] - med["base"])
            cells.append(f"{med[v.name]:8.1f} {over:7.1f} {ratio:7.2f}")
        if v.name != "base":
            cells.append(f"{readbacks_per_step(v, loss_of):11.1f}")
        print(" ".join(cells))
    return cpu


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    args = parser.parse_args(argv)
    print("$", shlex.join([sys.executable, *sys.argv]))
    torch.set_num_threads(1)  # the machine is shared: one thread keeps medians steady
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread, CPU")
    rounds = 8 if args.quick else 60
    bench("T5 (d_model 256, 2+2 layers, batch 4x64)", t5_model, rounds)
    bench("MLP (4 x [512->1024->512], batch 128)", mlp_model, rounds)
    print(
        "\nCPU ms: median thread CPU time per step (steadier than wall time on a shared"
        " machine); +ms: over base; vs DUO = (variant - base) / (DUO - base), target for distnb"
        " <= 0.25. DUO watches forward only; distnb forward + backward + .grad."
    )


if __name__ == "__main__":
    main()
