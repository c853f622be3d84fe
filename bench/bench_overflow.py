"""Benchmark the overflow tracer, mode by mode, against transformers' DebugUnderflowOverflow (DUO).

Run:  .venv/bin/python bench/bench_overflow.py [--quick] [--runs N] [--models t5,mlp,...]

Models, on CPU with one torch thread, random weights (no download), the same inputs for every
variant; one step = forward + backward + zero_grad:

- `t5`: a small T5 (d_model 256, 2+2 layers, batch 4x64), built from a config;
- `mlp`: 4 x [512 -> 1024, GELU, Dropout, 1024 -> 512], batch 128;
- `6x256`, `12x64`, `4x1024`: Linear+GELU pairs (depth x width), batch 64, 16 and 128: models
  made of many small modules, where a fixed cost per hook call shows (issue 13).

What is compared: the tracer costs more or less depending on what it records, so each of its
statistics modes gets a row, and each row says what it records per tensor against DUO (read off
`distnb.rank.overflow.stats` and `buffer`, checked on crafted tensors). DUO records, for each
module's weights, inputs and outputs in the forward only: `|x|` min, `|x|` max, and whether the
tensor holds a NaN and whether it holds an Inf (four host syncs a tensor). The tracer's modes:

- `fast` (its default): signed `aminmax(x)`, one pass. LESS than DUO: the largest `|x|`, but no
  smallest `|x|` when signs mix; NaN shows (aminmax propagates it) but then hides whether an Inf
  is there too.
- `auto`: `|x|` then `aminmax`. What DUO gives, bar one case: whether an Inf sits beside a NaN,
  on the step the NaN first shows (with a NaN there, DUO's `|x|` min and max are NaN too). Where
  the two numbers do not prove the zero, NaN and underflow counts, that tensor gets counts from
  the next step on (more than DUO; an Inf with no NaN beside it stays a flag, `|x|` max = inf).
- `full`: MORE than DUO: `|x|` min and max, the smallest non-zero `|x|`, NaN, Inf, zero and
  underflow counts, every tensor, every step.

Each mode runs twice: `<mode> fwd` (`phases=("forward",)`), the forward's weights, inputs and
outputs as DUO's (keyword inputs too, which DUO skips), and `<mode>`, the default phases, which
add the gradient into each module output and each parameter's `.grad`. So `auto fwd` and
`full fwd` are the rows at DUO's information or above; `fast`, the tracer's default, records
less.

Other variants, each on its own copy of the model with its hooks attached throughout:

- `base`: no hooks; `base again`: a second unwatched copy, the control: its figure is the noise;
- `floor`, `floor fwd`: the simplest hooks written in Python (`Floor`): one `aminmax` per module
  output, parameter (and, for `floor`, output gradient and `.grad`), through torch's hook API,
  with no names and nothing decoded; one `tolist()` a step. Not a tracer: its figure is what
  per-module Python hooks cost on this machine before any bookkeeping.

Timing: a run warms every variant up, then runs rounds; a round steps each variant once, the
order rotated by one place each round (each variant takes each position in turn), so that a busy
neighbour slows them all alike. A variant's overhead in a round is its step's thread CPU time
minus `base`'s in that same round. Printed per variant: the median step time over all rounds of
all runs; the median overhead; and `vs DUO` = median overhead / DUO's median overhead (the two
medians printed), with a 95% interval from a paired bootstrap over rounds (`ratio_of_medians`
in median_ci.py: a resampled round keeps the variant's and DUO's overheads together). `base
again`'s figure, printed the same way, is the noise floor. Targets (issue 13, for the default
`fast`, which records less than DUO): fast <= 0.25, fast fwd <= 0.15.

Host syncs per step are counted in an untimed pass, through a `TorchFunctionMode` that counts
every tensor method that hands a value to Python: `item`, `tolist`, `__format__` (DUO's f-strings
of 0-d tensors), `__bool__`, `__float__`, `__int__`, `numpy`, `cpu`. DUO makes 4 per tensor. On
CPU these do not wait for a device; on a GPU each one stalls the launch queue.

Peak memory, in another untimed pass: the bytes live at the peak of one step, from the profiler's
allocation events (what the step allocates above what was live before it) plus what was live
before it (parameters, buffers and the watch's own statistics buffers), for a training step and
for an eval step (forward under `no_grad`). Target: fast within 5% of base.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from median_ci import ratio_of_medians  # bench/ is on the path when the bench runs
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity, profile

import distnb.overflow as overflow

LossOf = Callable[[nn.Module], torch.Tensor]
TARGETS = {"fast": 0.25, "fast fwd": 0.15}
MEMORY_TARGET = 0.05

# What each statistics mode records per tensor, against DUO's |x| min, |x| max, NaN? and Inf?
# (see the module docstring; from `distnb.rank.overflow.stats.decode`/`decode_signed`).
RECORDS = {
    "fast": "less than DUO: no |x| min when signs mix, no Inf? beside a NaN",
    "auto": "what DUO gives, bar Inf? beside a NaN on its 1st step; +counts learnt",
    "full": "more than DUO: its figures + NaN/Inf/zero/underflow counts",
}
# Which tensors, per phases: DUO's are the forward's weights, inputs and outputs.
COVERS = {"fwd": "forward, as DUO", "all": "forward + backward, .grad"}

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
    records: str = ""  # what it records per tensor, against DUO
    watch: Any = None
    cpu: list[float] = field(default_factory=list)  # per round, over all runs: one step's time


def make_variants(model: nn.Module) -> list[Variant]:
    """`base` first (every overhead is against it), then the control, DUO, the tracer's modes
    and the floor (see the module docstring)."""
    from transformers.debug_utils import DebugUnderflowOverflow

    duo = copy.deepcopy(model)
    DebugUnderflowOverflow(duo)  # type: ignore[no-untyped-call]  # hooks stay: its own copy
    variants = [
        Variant("base", model, "no hooks"),
        Variant("base again", copy.deepcopy(model), "no hooks: the control"),
        Variant("DUO", duo, "|x| min, |x| max, NaN?, Inf?; forward"),
    ]
    for stats in RECORDS:
        for phases in ("fwd", "all"):
            variants.append(tracer(model, stats, phases))
    for name, backward in (("floor fwd", False), ("floor", True)):
        floor = copy.deepcopy(model)
        Floor(floor, backward)
        covers = "forward + backward, .grad" if backward else "forward"
        variants.append(Variant(name, floor, f"not a tracer: signed min/max; {covers}"))
    return variants


def tracer(model: nn.Module, stats: str, phases: str) -> Variant:
    """`watch()` on a copy of `model` in one statistics mode, forward only (`fwd`) or with the
    default phases (`all`); named `<mode> fwd` or `<mode>`."""
    ours = copy.deepcopy(model)
    options: dict[str, Any] = {"stats": stats}
    if phases == "fwd":
        options["phases"] = ("forward",)
    name = f"{stats} fwd" if phases == "fwd" else stats
    records = f"{RECORDS[stats]}; {COVERS[phases]}"
    return Variant(name, ours, records, overflow.watch(ours, **options))


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


def time_run(variants: list[Variant], loss_of: LossOf, rounds: int, first: int) -> None:
    """One run: warm-up, then `rounds` rounds of one step per variant. Round `first + r` starts
    at variant `first + r` (mod their number): each variant takes each place in turn, so none
    always runs first (on cold caches) or last."""
    for v in variants:
        for _ in range(3):  # warm up; `auto` learns which tensors need more statistics
            step(v.model, loss_of)
    for r in range(first, first + rounds):
        k = r % len(variants)
        for v in variants[k:] + variants[:k]:
            c0 = time.thread_time()
            step(v.model, loss_of)
            v.cpu.append(time.thread_time() - c0)


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


def overheads(v: Variant, base: Variant) -> list[float]:
    """Per round, `v`'s step time minus `base`'s in the same round: a busy neighbour that slows
    a round slows both, and the difference drops it."""
    return [t - b for t, b in zip(v.cpu, base.cpu, strict=True)]


HEADER = (
    f"  {'variant':11s} {'step ms':>8s} {'+ms':>7s} {'vs DUO [95% CI]':>21s} {'syncs/step':>10s}"
    f" {'train MiB':>10s} {'+%':>6s} {'eval MiB':>9s} {'+%':>6s}  records per tensor, vs DUO"
)


def row(v: Variant, base: Variant, duo: Variant, syncs: str, peaks: dict[str, Any]) -> str:
    """One variant's line: its median step, median overhead, the ratio of that median to DUO's
    (with its interval), host syncs, peak memory against `base`'s, what it records."""
    over = overheads(v, base)
    cells = [f"  {v.name:11s} {statistics.median(v.cpu) * 1e3:8.3f}"]
    cells.append(f"{statistics.median(over) * 1e3:7.3f}" if v is not base else f"{'':7s}")
    if v is base or v is duo:
        cells.append(f"{'':21s}")
    else:
        ratio, low, high = ratio_of_medians(over, overheads(duo, base))
        cells.append(f"{ratio:6.2f} [{low:5.2f}, {high:5.2f}]")
    cells.append(f"{syncs:>10s}")
    for i in (0, 1):
        mib, base_mib = peaks[v.name][i] / 2**20, peaks[base.name][i] / 2**20
        cells.append(f"{mib:10.1f} {100 * (mib / base_mib - 1):+5.1f}%")
    cells.append(f" {v.records}")
    return " ".join(cells)


def misses(m: Model, v: Variant, base: Variant, duo: Variant, peaks: dict[str, Any]) -> list[str]:
    """The targets `v` misses: its overhead ratio to DUO's, its peak memory over base's."""
    target = TARGETS.get(v.name)
    if target is None:
        return []
    out = []
    ratio = statistics.median(overheads(v, base)) / statistics.median(overheads(duo, base))
    if ratio > target:
        out.append(f"{m.key}: {v.name} {ratio:.2f} > {target}")
    worst = max(peaks[v.name][i] / peaks[base.name][i] - 1 for i in (0, 1))
    if worst > MEMORY_TARGET:
        out.append(f"{m.key}: {v.name} peak memory +{100 * worst:.1f}%")
    return out


def bench(m: Model, runs: int, rounds: int) -> list[str]:
    """Time, count syncs and measure memory for every variant on model `m`; print its table;
    return the targets missed."""
    torch.manual_seed(0)
    model, loss_of = m.build()
    variants = make_variants(model)
    for run in range(runs):
        time_run(variants, loss_of, rounds, first=run * rounds)
    peaks = {v.name: memory(v, loss_of) for v in variants}
    base, duo = variants[0], next(v for v in variants if v.name == "DUO")
    n_params = sum(p.numel() for p in model.parameters())
    print(f"\n{m.title}: {n_params / 1e6:.2f} M parameters; {runs} runs x {rounds} rounds")
    print(HEADER)
    missed = []
    for v in variants:
        syncs = "" if v.name.startswith("base") else f"{readbacks_per_step(v, loss_of):.1f}"
        print(row(v, base, duo, syncs, peaks))
        missed += misses(m, v, base, duo, peaks)
    return missed


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
    torch.set_num_threads(1)  # the machine is shared: one thread keeps medians steady
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread, CPU")
    print(
        "Each tracer mode (fast, auto, full; `fwd`: forward only, as DUO) against DUO, with what"
        " each records per tensor beside it: `auto fwd` and `full fwd` record at least what DUO"
        " does, `fast` less. Rounds step every variant once, in rotated order."
    )
    keys = args.models.split(",")
    missed = []
    for m in MODELS:
        if m.key in keys:
            runs, rounds = (1, max(3, m.rounds // 10)) if args.quick else (args.runs, m.rounds)
            missed += bench(m, runs, rounds)
    print(
        "\nstep ms: median thread CPU time of a step over all rounds; +ms: median over rounds of"
        " (variant - base in the same round); vs DUO = that median / DUO's (the +ms printed),"
        " 95% interval from a paired bootstrap over rounds; `base again` (no hooks) is the noise"
        " floor. Targets, for the default `fast` (records less than DUO): fast <= 0.25,"
        " fast fwd <= 0.15, peak memory within 5% of base."
    )
    print("Misses: " + ("; ".join(missed) if missed else "none"))


if __name__ == "__main__":
    from results import saved

    with saved("overflow"):
        main()
