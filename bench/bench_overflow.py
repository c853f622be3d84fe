"""Benchmark the overflow tracer against transformers' DebugUnderflowOverflow (DUO).

Run:  .venv/bin/python bench/bench_overflow.py [--quick] [--runs N] [--models t5,mlp,...]

Models, on CPU with one torch thread, random weights (no download), the same inputs for every
variant; one step = forward + backward + zero_grad:

- `t5`: a small T5 (d_model 256, 2+2 layers, batch 4x64), built from a config;
- `mlp`: 4 x [512 -> 1024, GELU, Dropout, 1024 -> 512], batch 128;
- `6x256`, `12x64`, `4x1024`: Linear+GELU pairs (depth x width), batch 64, 16 and 128: models
  made of many small modules, where a fixed cost per hook call shows (issue 13).

Variants, each on its own copy of the model with its hooks attached throughout:

- `base`: no hooks; `base again`: a second unwatched copy, the control: its ratio is the noise;
- `DUO`: `DebugUnderflowOverflow(model)`: forward hooks only (inputs, outputs, own weights);
- `distnb`: `distnb.overflow.watch(model)`, the default: `fast` statistics of the forward
  (inputs, outputs, own weights), backward (gradient into each module output) and each
  parameter's `.grad`: about twice as many tensors as DUO;
- `distnb fwd`: `watch(model, phases=("forward",))`: what DUO watches;
- `distnb auto`, `distnb full`: the other statistics modes, fwd+bwd+grad;
- `floor`, `floor fwd`: the simplest hooks written in Python (`Floor`): one `aminmax` per module
  output, parameter, output gradient and `.grad`, through torch's hook API, with no names and
  nothing decoded; one `tolist()` a step. Not a tracer: its ratio is what per-module Python
  hooks cost on this machine before any bookkeeping.

Timing: a run warms every variant up, then runs rounds; a round steps each variant once, in a
shuffled order, so that a busy neighbour slows them all alike. Per variant and run: the median
thread CPU time of a step; overhead ratio = (variant - base) / (DUO - base). Printed: the median
ratio over runs and its spread (min-max). Targets (issue 13): distnb <= 0.25, distnb fwd <= 0.15.

Host syncs per step are counted in an untimed pass, through a `TorchFunctionMode` that counts
every tensor method that hands a value to Python: `item`, `tolist`, `__format__` (DUO's f-strings
of 0-d tensors), `__bool__`, `__float__`, `__int__`, `numpy`, `cpu`. DUO makes 4 per tensor. On
CPU these do not wait for a device; on a GPU each one stalls the launch queue.

Peak memory, in another untimed pass: the bytes live at the peak of one step, from the profiler's
allocation events (what the step allocates above what was live before it) plus what was live
before it (parameters, buffers and the watch's own statistics buffers), for a training step and
for an eval step (forward under `no_grad`). Target: distnb within 5% of base.
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
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity, profile

import distnb.overflow as overflow

LossOf = Callable[[nn.Module], torch.Tensor]
TARGETS = {"distnb": 0.25, "distnb fwd": 0.15}
MEMORY_TARGET = 0.05

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


# -- models -------------------------------------------------------------------------------------


def t5_model() -> tuple[nn.Module, LossOf]:
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


def mlp_model() -> tuple[nn.Module, LossOf]:
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(512, 1024), nn.GELU(), nn.Dropout(0.1), nn.Linear(1024, 512)]
    model = nn.Sequential(*layers)
    x = torch.randn(128, 512, generator=torch.Generator().manual_seed(0))
    return model, lambda m: m(x).square().mean()


def gelu_stack(depth: int, width: int, batch: int) -> Callable[[], tuple[nn.Module, LossOf]]:
    def build() -> tuple[nn.Module, LossOf]:
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.GELU()]
        x = torch.randn(batch, width, generator=torch.Generator().manual_seed(0))
        return nn.Sequential(*layers), lambda m: m(x).square().mean()

    return build


@dataclass(frozen=True)
class Model:
    key: str
    title: str
    build: Callable[[], tuple[nn.Module, LossOf]]
    rounds: int  # timed rounds per run: more for fast steps, whose medians are noisier


MODELS = (
    Model("t5", "T5 (d_model 256, 2+2 layers, batch 4x64)", t5_model, 20),
    Model("mlp", "MLP (4 x [512->1024->512], batch 128)", mlp_model, 30),
    Model("6x256", "Linear+GELU 6 x 256, batch 64", gelu_stack(6, 256, 64), 150),
    Model("12x64", "Linear+GELU 12 x 64, batch 16", gelu_stack(12, 64, 16), 250),
    Model("4x1024", "Linear+GELU 4 x 1024, batch 128", gelu_stack(4, 1024, 128), 25),
)


# -- variants -----------------------------------------------------------------------------------


@dataclass
class Variant:
    """One way of running the model, on its own copy of it, hooks attached for the whole run."""

    name: str
    model: nn.Module
    watch: Any = None
    cpu: list[list[float]] = field(default_factory=list)  # per run, per timed step


def make_variants(model: nn.Module) -> list[Variant]:
    from transformers.debug_utils import DebugUnderflowOverflow

    duo = copy.deepcopy(model)
    DebugUnderflowOverflow(duo)  # type: ignore[no-untyped-call]  # hooks stay: its own copy
    variants = [
        Variant("base", model),
        Variant("base again", copy.deepcopy(model)),
        Variant("DUO", duo),
    ]
    for name, options in (
        ("distnb", {}),
        ("distnb fwd", {"phases": ("forward",)}),
        ("distnb auto", {"stats": "auto"}),
        ("distnb full", {"stats": "full"}),
    ):
        ours = copy.deepcopy(model)
        variants.append(Variant(name, ours, overflow.watch(ours, **options)))
    for name, backward in (("floor", True), ("floor fwd", False)):
        floor = copy.deepcopy(model)
        Floor(floor, backward)
        variants.append(Variant(name, floor))
    return variants


class Floor:
    """Hooks that do no more than compute each tensor's statistics (see `floor` above)."""

    def __init__(self, model: nn.Module, backward: bool) -> None:
        self.buf = torch.empty(1 << 14, 2)
        self.cells = [(row[0], row[1]) for row in self.buf.unbind()]
        self.n = 0
        self.backward = backward
        model.register_forward_pre_hook(self._step)
        for m in model.modules():
            m.register_forward_hook(self._forward)
        if backward:
            for p in model.parameters():
                p.register_post_accumulate_grad_hook(lambda p: self._stat(p.grad))

    def _stat(self, t: torch.Tensor | None) -> None:
        if t is not None and t.dtype is torch.float32:
            torch.aminmax(t, out=self.cells[self.n])
            self.n += 1

    def _step(self, module: nn.Module, args: Any) -> None:
        self.buf[: self.n].tolist()  # the step's one host sync
        self.n = 0

    def _forward(self, module: nn.Module, args: Any, output: Any) -> None:
        outs = (output,) if type(output) is torch.Tensor else output
        if type(outs) is not tuple:
            return
        grad = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        for p in module._parameters.values():
            self._stat(p)
        for t in outs:
            if type(t) is torch.Tensor:
                self._stat(t)
        torch._C._set_grad_enabled(grad)
        if self.backward:
            for t in outs:
                if type(t) is torch.Tensor and t.requires_grad:
                    t.register_hook(self._stat)


def step(model: nn.Module, loss_of: LossOf) -> None:
    loss_of(model).backward()  # type: ignore[no-untyped-call]
    model.zero_grad(set_to_none=True)


def time_run(variants: list[Variant], loss_of: LossOf, rounds: int, seed: int) -> None:
    """One run: warm-up, then `rounds` rounds of one step per variant in a shuffled order."""
    for v in variants:
        for _ in range(3):  # warm up; `auto` learns which tensors need more statistics
            step(v.model, loss_of)
        v.cpu.append([])
    order = list(variants)
    rnd = random.Random(seed)
    for _ in range(rounds):
        rnd.shuffle(order)
        for v in order:
            c0 = time.thread_time()
            step(v.model, loss_of)
            v.cpu[-1].append(time.thread_time() - c0)


def readbacks_per_step(v: Variant, loss_of: LossOf) -> float:
    n_steps = 4
    counter = CountReadbacks()
    with counter:
        for _ in range(n_steps):
            step(v.model, loss_of)
    return counter.n / n_steps


def peak_bytes(v: Variant, run: Callable[[], object]) -> int:
    """Bytes live at the peak of `run()`: what it allocates above its start, from the profiler's
    allocation events, plus what was live before it (see the module docstring)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    assert prof.profiler is not None and prof.profiler.kineto_results is not None
    events = prof.profiler.kineto_results.events()
    deltas = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in deltas:
        live += nbytes
        peak = max(peak, live)
    held = [*v.model.parameters(), *v.model.buffers()]
    before = sum(t.numel() * t.element_size() for t in held)
    return before + peak + (v.watch.buffer_bytes if v.watch is not None else 0)


def memory(v: Variant, loss_of: LossOf) -> tuple[int, int]:
    """(peak bytes of a training step, of an eval step)."""

    def evaluate() -> None:
        with torch.no_grad():
            loss_of(v.model)

    step(v.model, loss_of)
    evaluate()
    return peak_bytes(v, lambda: step(v.model, loss_of)), peak_bytes(v, evaluate)


# -- report -------------------------------------------------------------------------------------


def ratios(variants: list[Variant]) -> dict[str, list[float]]:
    """Per variant, the overhead ratio to DUO's of each run."""
    out: dict[str, list[float]] = {v.name: [] for v in variants}
    by_name = {v.name: v for v in variants}
    for run in range(len(variants[0].cpu)):
        med = {v.name: statistics.median(v.cpu[run]) for v in variants}
        duo = med["DUO"] - med["base"]
        for v in variants:
            out[v.name].append((med[v.name] - med["base"]) / duo)
    assert by_name
    return out


def bench(m: Model, runs: int, rounds: int) -> list[str]:
    torch.manual_seed(0)
    model, loss_of = m.build()
    variants = make_variants(model)
    for run in range(runs):
        time_run(variants, loss_of, rounds, seed=run)
    over = ratios(variants)
    peaks = {v.name: memory(v, loss_of) for v in variants}
    n_params = sum(p.numel() for p in model.parameters())
    print(f"\n{m.title}: {n_params / 1e6:.2f} M parameters; {runs} runs x {rounds} rounds")
    print(
        f"  {'variant':12s} {'CPU ms':>8s} {'+ms':>7s} {'vs DUO':>7s} {'[min, max]':>14s}"
        f" {'syncs/step':>10s} {'train MiB':>10s} {'+%':>6s} {'eval MiB':>9s} {'+%':>6s}"
    )
    misses = []
    base_ms = statistics.median(statistics.median(r) for r in variants[0].cpu) * 1e3
    for v in variants:
        ms = statistics.median(statistics.median(r) for r in v.cpu) * 1e3
        r = over[v.name]
        cells = [f"  {v.name:12s} {ms:8.2f} {ms - base_ms:7.2f}"]
        cells.append(f"{statistics.median(r):7.2f} [{min(r):5.2f}, {max(r):5.2f}]")
        syncs = "" if v.name.startswith("base") else f"{readbacks_per_step(v, loss_of):.1f}"
        cells.append(f"{syncs:>10s}")
        for i in (0, 1):
            mib, base_mib = peaks[v.name][i] / 2**20, peaks["base"][i] / 2**20
            cells.append(f"{mib:10.1f} {100 * (mib / base_mib - 1):+5.1f}%")
        print(" ".join(cells))
        target = TARGETS.get(v.name)
        if target is not None and statistics.median(r) > target:
            misses.append(f"{m.key}: {v.name} {statistics.median(r):.2f} > {target}")
        worst = max(peaks[v.name][i] / peaks["base"][i] - 1 for i in (0, 1))
        if v.name in TARGETS and worst > MEMORY_TARGET:
            misses.append(f"{m.key}: {v.name} peak memory +{100 * worst:.1f}%")
    return misses


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 run, few rounds")
    parser.add_argument("--runs", type=int, default=5, help="runs per model (default 5)")
    parser.add_argument(
        "--models",
        default=",".join(m.key for m in MODELS),
        help="comma-separated, of: " + ", ".join(m.key for m in MODELS),
    )
    args = parser.parse_args(argv)
    print("$", shlex.join([sys.executable, *sys.argv]))
    torch.set_num_threads(1)  # the machine is shared: one thread keeps medians steady
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread, CPU")
    keys = args.models.split(",")
    misses = []
    for m in MODELS:
        if m.key in keys:
            runs, rounds = (1, max(3, m.rounds // 10)) if args.quick else (args.runs, m.rounds)
            misses += bench(m, runs, rounds)
    print(
        "\nCPU ms: median over runs of the median thread CPU time per step; vs DUO = (variant -"
        " base) / (DUO - base), median over runs [min, max]; `base again` is the control."
        " Targets: distnb <= 0.25, distnb fwd <= 0.15, peak memory within 5% of base."
    )
    print("Misses: " + ("; ".join(misses) if misses else "none"))


if __name__ == "__main__":
    main()
