"""The overflow tracer on real modules in one process, on CPU (no ranks needed)."""

from __future__ import annotations

import copy
import io
import itertools
import math
import pickle
import weakref
from typing import Any, ClassVar

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import distnb.overflow as overflow
from distnb.errors import ConfigError, DistnbWarning, NonFiniteError, OverflowStop
from distnb.rank import overflow as rank_overflow
from distnb.rank.overflow.stats import ALL, decode, decode_signed, limits, stats_kernel
from distnb.records.overflow import Phase, RankOverflowReport, Stats, WatchOptions


def mlp(*widths: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def train_step(model: nn.Module, x: torch.Tensor) -> None:
    model(x).float().square().mean().backward()
    model.zero_grad(set_to_none=True)


class Scale(nn.Module):
    """y = x * w: a parameter whose gradient is a reduction over the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w


class GatedFF(nn.Module):
    """mT5's feed-forward block (T5 v1.1 DenseGatedActDense): gelu(wi_0 x) * wi_1 x -> wo."""

    def __init__(self, d: int = 16, f: int = 64) -> None:
        super().__init__()
        self.wi_0 = nn.Linear(d, f, bias=False)
        self.wi_1 = nn.Linear(d, f, bias=False)
        self.dropout = nn.Dropout(0.1)
        self.wo = nn.Linear(f, d, bias=False)
        for lin in (self.wi_0, self.wi_1, self.wo):
            nn.init.constant_(lin.weight, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.gelu(self.wi_0(x)) * self.wi_1(x)
        return self.wo(self.dropout(h))


class Poison(nn.Module):
    """Puts a NaN into its output, the way an overflowing op would."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        y[0, 0] = math.nan
        return y


class Clean(nn.Module):
    """Replaces NaN with 0 (in place or not): the NaN is gone by the next module's output."""

    def __init__(self, in_place: bool) -> None:
        super().__init__()
        self.in_place = in_place

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.nan_to_num_() if self.in_place else torch.nan_to_num(x)


def gelu_mlp(pairs: int, width: int = 8) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(pairs):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers)


# -- the statistics themselves ------------------------------------------------------------------


def reference(x: torch.Tensor, tiny: float) -> tuple[float, float, int, int, int, int]:
    a = x.abs().double()
    nonzero = a[(a > 0) & ~a.isnan()]
    finite_nz = nonzero[nonzero.isfinite()]
    return (
        float(finite_nz.min()) if finite_nz.numel() else math.nan,
        float(a.max()),
        int(x.isnan().sum()),
        int(x.isinf().sum()),
        int((x == 0).sum()),
        int(((a > 0) & (a < tiny)).sum()),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("with_nan", [False, True])
def test_full_statistics_match_a_bool_mask_reference(dtype: torch.dtype, with_nan: bool) -> None:
    lim = limits(dtype)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1000, generator=g).to(dtype)
    x[:7] = torch.tensor([0.0, 0.0, lim.subnormal, -lim.subnormal * 3, lim.max, -math.inf, 3.0])
    if with_nan:
        x[10:13] = math.nan
    values, counts = stats_kernel(x, ALL, lim.tiny)
    v = [float(t) for t in values]
    c = [float(t) for t in counts]
    got = decode(x.numel(), ALL, lim.tiny, lim.max, v, c)
    min_nz, amax, nan, inf, zeros, under = reference(x, lim.tiny)
    assert (got.nan, got.inf, got.zeros, got.under) == (nan, inf, zeros, under)
    assert got.min_nonzero == min_nz
    assert math.isnan(got.abs_max) if with_nan else got.abs_max == amax


def test_signed_statistics_prove_counts_only_where_they_can() -> None:
    lim = limits(torch.float32)
    some_inf = decode_signed(-math.inf, 2.0, lim.tiny, 10)
    assert (some_inf.abs_max, some_inf.nan, some_inf.inf, some_inf.abs_min) == (
        math.inf,
        0,
        None,
        None,
    )
    all_inf = decode_signed(-math.inf, -math.inf, lim.tiny, 10)
    assert (all_inf.nan, all_inf.inf, all_inf.zeros) == (0, 10, 0)
    positive = decode_signed(0.5, 2.0, lim.tiny, 10)
    assert (positive.abs_min, positive.nan, positive.inf, positive.zeros) == (0.5, 0, 0, 0)
    assert math.isnan(decode_signed(math.nan, math.nan, lim.tiny, 10).abs_max)


def test_base_statistics_prove_counts_or_leave_them_open() -> None:
    lim = limits(torch.float32)
    clean = decode(10, 0, lim.tiny, lim.max, [0.5, 2.0], [])
    assert (clean.nan, clean.inf, clean.zeros, clean.under, clean.min_nonzero) == (0, 0, 0, 0, 0.5)
    zeros = decode(10, 0, lim.tiny, lim.max, [0.0, 2.0], [])
    assert (zeros.nan, zeros.inf, zeros.zeros, zeros.min_nonzero) == (0, 0, None, None)
    inf = decode(10, 0, lim.tiny, lim.max, [0.5, math.inf], [])
    assert (inf.nan, inf.inf) == (0, None)  # aminmax propagates NaN: an Inf max means no NaN


# -- where the first non-finite value appears ---------------------------------------------------


def test_inf_produced_in_a_layers_forward_is_named() -> None:
    model = mlp(4, 8, 8, 8, 2)
    with torch.no_grad():
        model[0].weight.fill_(0.25)
        model[0].bias.zero_()  # layer 0 outputs 1.0 everywhere
        model[2].weight.fill_(1e38)  # finite weights whose sum of 8 products overflows float32
    w = overflow.watch(model, frames=5)
    train_step(model, torch.ones(3, 4))
    w.step()
    r = w.report()
    assert r.first is not None
    assert (r.first.module, r.first.cls, r.first.phase, r.first.name) == (
        "2",
        "Linear",
        Phase.FORWARD,
        "output",
    )
    # `fast` statistics: every value is +Inf, so the smallest |x| is Inf and proves the counts.
    assert (r.first.nan, r.first.inf, r.first.zeros) == (0, 24, 0)
    assert r.first.describe() == "0 NaN, 24 Inf of 24 values"
    assert r.ring[-1] == r.first and len(r.ring) == 5
    assert all(not f.nonfinite for f in r.ring[:-1])
    assert [f.name for f in r.ring[-4:-1]] == ["weight", "bias", "input[0]"]
    w.detach()


def test_counts_of_the_first_frame_under_full_statistics() -> None:
    model = mlp(4, 8, 2)
    with torch.no_grad():
        model[0].weight.fill_(1e38)
    w = overflow.watch(model, stats="full")
    model(torch.ones(3, 4))
    w.step()
    first = w.report().first
    assert first is not None and first.module == "0"
    assert (first.nan, first.inf, first.zeros) == (0, 24, 0)
    assert first.describe() == "0 NaN, 24 Inf of 24 values"
    w.detach()


def test_nan_first_appearing_in_a_gradient() -> None:
    model = nn.Sequential(nn.Linear(2, 2), Scale())
    with torch.no_grad():
        model[0].weight.copy_(torch.eye(2))
        model[0].bias.zero_()
    w = overflow.watch(model)
    y = model(torch.tensor([[1e20, -1e20]]))
    # dL/dy = 1e20 and dL/dx stay finite; dL/dw = sum(x * 1e20) = +inf + -inf = NaN.
    (y * 1e20).sum().backward()
    w.step()
    first = w.report().first
    assert first is not None
    assert (first.module, first.phase, first.name) == ("1", Phase.GRAD, "w.grad")
    assert math.isnan(first.abs_max)
    w.detach()


@pytest.mark.parametrize("stats", list(Stats))
@pytest.mark.parametrize("in_place", [False, True])
def test_nan_cleaned_by_the_next_module_is_still_named(stats: Stats, in_place: bool) -> None:
    model = nn.Sequential(nn.Linear(4, 4), Poison(), Clean(in_place), nn.Linear(4, 2))
    w = overflow.watch(model, stats=stats, trace_batches=[0])
    train_step(model, torch.randn(3, 4))
    w.step()
    r = w.report()
    assert r.first is not None and r.first.step == 0
    assert r.first.where == "1 (Poison) forward output" and math.isnan(r.first.abs_max)
    forward = {(f.module, f.name): f for f in r.traced if f.phase is Phase.FORWARD}
    assert not forward[("2", "output")].nonfinite  # gone by the next module's output
    assert not forward[("3", "input[0]")].nonfinite and not forward[("3", "output")].nonfinite
    w.detach()


def test_inference_tensors_and_leaf_outputs_are_watched() -> None:
    model = nn.Sequential(nn.Identity(), nn.Linear(4, 2))
    w = overflow.watch(model, trace_batches=[0, 1])
    x = torch.randn(3, 4, requires_grad=True)  # Identity returns this leaf: no grad_fn to hook
    model(x).sum().backward()
    with torch.inference_mode():  # tensors without a version counter
        model(torch.randn(3, 4))
    w.step()
    frames = {(f.step, f.module, f.phase, f.name) for f in w.report().traced}
    assert (0, "0", Phase.BACKWARD, "grad_output") in frames
    assert (1, "1", Phase.FORWARD, "output") in frames
    w.detach()


def test_the_watch_keeps_no_activation_alive() -> None:
    model = gelu_mlp(4, width=64)
    alive: list[weakref.ref[torch.Tensor]] = []
    for m in model:
        m.register_forward_hook(lambda m, a, out: alive.append(weakref.ref(out)))
    w = overflow.watch(model)
    with torch.no_grad():  # eval: nothing is saved for backward, each output dies at once
        out = model(torch.randn(16, 64))
    assert [r() is None for r in alive] == [True] * (len(alive) - 1) + [False]
    assert alive[-1]() is out
    assert w.buffer_bytes < 4096  # a few scalars a tensor, nothing shaped like the model's
    w.detach()


def test_the_watch_keeps_no_gradient_alive_after_backward() -> None:
    model = gelu_mlp(4, width=64)
    grads: list[weakref.ref[torch.Tensor]] = []

    def keep_ref(m: nn.Module, args: Any, out: torch.Tensor) -> None:
        out.register_hook(lambda g: grads.append(weakref.ref(g)))  # type: ignore[no-untyped-call]

    for m in model:
        m.register_forward_hook(keep_ref)
    w = overflow.watch(model)
    model(torch.randn(16, 64)).sum().backward()
    assert len(grads) == len(model) and all(r() is None for r in grads)
    w.detach()


# -- fp16: headroom, then overflow --------------------------------------------------------------


def test_fp16_gated_product_warns_on_headroom_before_it_overflows() -> None:
    torch.manual_seed(0)
    model = GatedFF().half()  # CPU runs float16 matmuls (torch 2.13)
    w = overflow.watch(model, headroom_warn_bits=3)
    x = torch.full((2, 16), 4.0, dtype=torch.float16)

    def fp16_step(x: torch.Tensor) -> None:  # a small loss keeps the gradients in range
        (model(x).float().mean() * 1e-3).backward()
        model.zero_grad()

    fp16_step(x)  # wo's output ~ 2048 * 4**2 = 32768: finite, 1 bit from 65504
    with pytest.warns(DistnbWarning) as caught:
        w.step()
    messages = [str(c.message) for c in caught]
    assert len(messages) == 1  # not again for <root>: its output is the same tensor as wo's
    assert "wo (Linear) forward output at step 0" in messages[0]
    assert "leaves 0.9 bits of float16 headroom" in messages[0]  # 32768 / 0.9 (dropout)
    assert w.report().first is None
    fp16_step(x * 2)  # ~131072: overflows float16
    w.step()
    r = w.report()
    assert r.first is not None and r.first.step == 1
    assert (r.first.module, r.first.name, r.first.compute_dtype) == ("wo", "output", "float16")
    warned = next(f for f in r.headroom if f.phase is Phase.FORWARD)
    assert (warned.step, warned.module, warned.name) == (0, "wo", "output")
    assert warned.headroom_bits is not None and warned.headroom_bits < 4
    w.detach()


def test_autocast_frames_use_the_dtype_the_module_computed_in() -> None:
    model = GatedFF()  # float32 weights
    w = overflow.watch(model, trace_batches=[0], headroom_warn_bits=0)
    with torch.autocast("cpu", dtype=torch.float16):
        model(torch.ones(2, 16))
    w.step()
    frames = {(f.module, f.name): f for f in w.report().traced}
    weight = frames[("wo", "weight")]
    assert (weight.dtype, weight.compute_dtype) == ("float32", "float16")
    assert weight.headroom_bits == pytest.approx(math.log2(65504 / 0.5))
    assert frames[("dropout", "output")].compute_dtype == "float16"
    w.detach()


# -- syncs, steps, tracing, stopping ------------------------------------------------------------


class CountReadbacks(TorchFunctionMode):
    """Counts every tensor method that hands a value to Python."""

    METHODS: ClassVar = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__}
    METHODS |= {torch.Tensor.__float__, torch.Tensor.__format__, torch.Tensor.cpu}
    METHODS |= {torch.Tensor.__int__, torch.Tensor.__index__, torch.Tensor.numpy}

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.n += func in self.METHODS
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("stats", ["auto", "fast", "full"])
def test_exactly_one_readback_per_step(stats: str) -> None:
    model = mlp(4, 16, 16, 2)
    x = torch.randn(8, 4)
    w = overflow.watch(model, stats=stats)
    with CountReadbacks() as counter:
        for _ in range(4):
            train_step(model, x)
        model(x)  # the root's next forward ends step 3
    assert w.readbacks == 4
    assert counter.n == 4  # no other host sync anywhere in the tracer
    assert w.report().steps == 4
    w.detach()


class CountScalarReads(TorchDispatchMode):
    """Counts the aten ops that copy a tensor's value to the host (`item`, `bool`, `float`...)."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.n += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))


def test_a_step_of_many_modules_makes_one_host_sync() -> None:
    model = gelu_mlp(40)  # 81 modules: 81 forward hooks, 81 gradients, 80 .grad per step
    w = overflow.watch(model)
    with CountReadbacks() as methods, CountScalarReads() as scalars:
        for _ in range(2):
            train_step(model, torch.randn(4, 8))
        w.step()
    assert w.readbacks == 2 and w.report().steps == 2
    assert methods.n == 2  # the step's one `.tolist()`: nothing else reads a value back
    assert scalars.n == 0  # no `.item()`/`bool()` per tensor underneath either
    assert len(w.report().ring) == 21
    w.detach()


def test_a_watched_model_saves_whole_and_copies_unwatched() -> None:
    model = mlp(4, 8, 2)
    x = torch.randn(3, 4)
    w = overflow.watch(model, trace_batches=[0])
    train_step(model, x)
    buf = io.BytesIO()
    torch.save(model, buf)  # a checkpoint of the whole module, hooks included
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    twin = copy.deepcopy(model)
    for other in (loaded, twin):
        with torch.no_grad():
            other[0].weight.fill_(math.inf)  # would be the first non-finite frame if watched
        train_step(other, x)
        assert torch.equal(other[2].weight, model[2].weight)
    train_step(model, x)
    w.step()
    r = w.report()
    assert r.steps == 2 and r.first is None  # the copies' steps never reached this watch
    assert {f.step for f in r.traced} == {0}
    w.detach()


@pytest.mark.parametrize("user_first", [True, False])
def test_user_hooks_on_outputs_and_leaf_inputs_live_beside_the_watch(user_first: bool) -> None:
    model = nn.Sequential(nn.Identity(), nn.Linear(4, 2))
    seen: list[torch.Tensor] = []

    def keep_grad(m: nn.Module, args: Any, out: torch.Tensor) -> None:
        out.register_hook(seen.append)  # type: ignore[no-untyped-call]

    if user_first:
        model[1].register_forward_hook(keep_grad)
    w = overflow.watch(model, trace_batches=[0, 1, 2])
    if not user_first:
        model[1].register_forward_hook(keep_grad)
    x = torch.randn(3, 4, requires_grad=True)  # a leaf the Identity returns, every step
    for _ in range(3):
        model(x).sum().backward()
    w.step()
    assert len(seen) == 3 and all(torch.equal(g, torch.ones(3, 2)) for g in seen)
    assert x._backward_hooks is not None and len(x._backward_hooks) == 1  # not one per step
    backward = [(f.step, f.module) for f in w.report().traced if f.phase is Phase.BACKWARD]
    assert backward == [(s, m) for s in range(3) for m in ("1", "", "0")]
    w.detach()


def test_detach_restores_the_model() -> None:
    model = mlp(4, 8, 2)
    x = torch.randn(3, 4)
    w = overflow.watch(model)
    train_step(model, x)
    train_step(model, x)
    w.detach()
    assert not w.attached
    for m in model.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks
        assert not m._forward_hooks_with_kwargs
    for p in model.parameters():
        assert not p._post_accumulate_grad_hooks
    before = w.readbacks
    for _ in range(3):
        train_step(model, x)
    assert w.readbacks == before and w.report().steps == 1


def test_trace_batches_keeps_every_frame_of_those_steps() -> None:
    model = mlp(4, 8, 2)
    w = overflow.watch(model, trace_batches=[1])
    for _ in range(3):
        train_step(model, torch.randn(3, 4))
    w.step()
    traced = w.report().traced
    assert {f.step for f in traced} == {1}
    assert [f.order for f in traced] == list(range(len(traced)))
    seen = {(f.module, f.phase, f.name) for f in traced}
    for i in ("0", "2"):
        assert {(i, Phase.FORWARD, "weight"), (i, Phase.GRAD, "weight.grad")} <= seen
    assert ("1", Phase.BACKWARD, "grad_output") in seen
    assert ("", Phase.FORWARD, "output") in seen
    w.detach()


def test_abort_after_stops_cleanly_before_the_next_step() -> None:
    model = mlp(4, 8, 2)
    x = torch.randn(3, 4)
    w = overflow.watch(model, abort_after=1)
    train_step(model, x)
    train_step(model, x)
    with pytest.raises(OverflowStop, match="stopped after step 1") as info:
        train_step(model, x)
    stopped = info.value.report
    assert stopped is not None and stopped.stopped == "abort_after" and stopped.steps == 2
    again = pickle.loads(pickle.dumps(info.value))  # how it travels to the kernel
    assert str(again) == str(info.value) and again.report == stopped
    assert not w.attached
    train_step(model, x)  # the model still runs, unwatched


def test_stop_on_nonfinite_raises_at_the_readback() -> None:
    model = mlp(4, 8, 2)
    with torch.no_grad():
        model[0].weight.fill_(1e38)
    w = overflow.watch(model, stop_on_nonfinite=True)
    model(torch.ones(3, 4))
    with pytest.raises(NonFiniteError, match=r"rank 0: non-finite values at step 0, 0 \(Linear\)"):
        model(torch.ones(3, 4))
    assert not w.attached and w.report().stopped == "nonfinite"


def test_explicit_steps_count_micro_steps() -> None:
    model = mlp(4, 8, 2)
    w = overflow.watch(model, step_on="explicit", trace_batches=[0])
    train_step(model, torch.randn(3, 4))
    train_step(model, torch.randn(3, 4))
    w.step()
    traced = w.report().traced
    assert {f.micro for f in traced} == {0, 1} and w.readbacks == 1
    w.detach()


def test_report_mid_step_reads_back_and_the_step_goes_on() -> None:
    model = mlp(4, 8, 2)
    w = overflow.watch(model, step_on="explicit", trace_batches=[0])
    model(torch.randn(3, 4))
    assert w.report().steps == 0 and w.readbacks == 1
    model(torch.randn(3, 4))  # the same weights again, now in a fresh buffer
    w.step()
    weights = [f for f in w.report().traced if f.name == "weight" and f.module == "0"]
    assert [f.micro for f in weights] == [0, 1]
    assert weights[0].abs_max == weights[1].abs_max == model[0].weight.abs().max().item()
    w.detach()


def test_report_round_trips_through_json() -> None:
    model = mlp(4, 8, 2)
    w = overflow.watch(model, trace_batches=[0])
    train_step(model, torch.randn(3, 4))
    r = w.report()
    assert RankOverflowReport.from_dict(r.to_dict()) == r
    w.detach()


def test_detect_warns_with_counts() -> None:
    assert not overflow.detect(torch.ones(3), "ones")
    with pytest.warns(DistnbWarning, match="grad after all_reduce: 2 NaN, 1 Inf of 4 values"):
        assert overflow.detect(
            torch.tensor([math.nan, math.nan, math.inf, 1.0]), "grad after all_reduce"
        )


def test_bad_arguments_name_the_fix() -> None:
    model = mlp(2, 2)
    with pytest.raises(ConfigError, match="phases must be some of"):
        overflow.watch(model, phases=("forwards",))
    with pytest.raises(ConfigError, match="stats must be"):
        overflow.watch(model, stats="everything")


def test_a_watch_takes_its_options_as_one_record() -> None:
    model = mlp(4, 2)
    w = overflow.Watch(model, WatchOptions.of(stats="auto", phases=("grad",)))
    assert w.options.stats is Stats.AUTO and w.options.phases == (Phase.GRAD,)
    assert w.report().stats is Stats.AUTO
    w.detach()
    assert overflow.watch(model).options == WatchOptions(rank=None).validated()


def test_named_registry_replaces_and_detaches() -> None:
    model = mlp(4, 2)
    first = rank_overflow.attach("model", model)
    second = rank_overflow.attach("model", model)
    assert not first.attached and second.attached
    assert rank_overflow.attached() == {"model": second}
    assert rank_overflow.detach("model") and not rank_overflow.detach("model")
    assert not second.attached
