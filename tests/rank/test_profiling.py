"""The rank's side of profiling, in this process with a real `torch.profiler`: spans on the
monotonic clock, modules named forward and backward, the step limit, an optimizer's closure, an
attached rank's profile of whole steps, nothing left once off."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import torch
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optimizer_module

from distnb.rank import profiling
from distnb.records.profiling import Profiled, RankProfile, SpanKind


@pytest.fixture
def armed() -> Iterator[None]:
    yield
    profiling.collect()  # whatever a failed test left armed


def _train(steps: int) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(torch.randn(4, 16)).sum().backward()
        opt.step()
        opt.zero_grad()


def _profile(steps: int, limit: int | None = None) -> RankProfile:
    profiling.arm(limit)
    cell = profiling._armed
    assert cell is not None
    cell._pre()  # what the engine's pre_run_cell hook does
    _train(steps)
    cell._post()
    profile = profiling.collect()
    assert profile is not None
    return profile


def test_spans_are_on_the_monotonic_clock_inside_the_cell(armed: None) -> None:
    before = time.monotonic_ns()
    p = _profile(3)
    after = time.monotonic_ns()
    ((start, end),) = p.windows
    assert before <= start < end <= after
    assert p.spans and all(start <= s.start_ns <= end for s in p.spans)
    assert 0 < p.clock_precision_ns < 1_000_000  # the marker maps the clocks within 1 ms
    kinds = {s.kind for s in p.spans}
    assert {SpanKind.MODULE, SpanKind.OPTIMIZER, SpanKind.OP} <= kinds


def test_modules_are_named_in_their_forward_and_their_backward(armed: None) -> None:
    names = {s.name.removeprefix("nn.Module: ") for s in _profile(2).spans}
    layers = {"Sequential.0 (Linear)", "Sequential.1 (ReLU)", "Sequential.2 (Linear)"}
    assert {"Sequential", *layers} <= names  # two Linear layers told apart by their paths
    assert {f"{layer} (backward)" for layer in layers} <= names


def test_a_wrapped_model_is_named_from_the_model_inside_its_wrappers() -> None:
    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 4))

    class Wrapper(torch.nn.Module):  # as DDP and FSDP keep the model: in `module`
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.module = model

    model = Model()
    names = profiling.module_names(Wrapper(model))
    assert sorted(names.values()) == [
        "Model", "Model.net (Sequential)", "Model.net.0 (Linear)", "Wrapper"
    ]  # fmt: skip
    assert names[model.net[0]] == "Model.net.0 (Linear)"


def test_a_step_limit_ends_the_window_at_that_step(armed: None) -> None:
    p = _profile(4, limit=2)
    steps = [s for s in p.spans if s.name.startswith("Optimizer.step")]
    assert len(steps) == 2 and p.steps_limit == 2
    assert steps[-1].start_ns <= p.windows[0][1] <= steps[-1].end_ns  # cut in its step hook


def test_nothing_is_left_hooked_once_collected(armed: None) -> None:
    hooks = (dict(nn_module._global_forward_pre_hooks), dict(nn_module._global_forward_hooks))
    _profile(1)
    assert not profiling.armed() and profiling.collect() is None
    assert (
        dict(nn_module._global_forward_pre_hooks),
        dict(nn_module._global_forward_hooks),
    ) == hooks
    assert not torch._C._autograd._profiler_enabled()


def test_an_optimizer_step_with_a_closure_is_its_time_after_the_closure(armed: None) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def closure() -> torch.Tensor:  # as Lightning's automatic optimization passes its step
        opt.zero_grad()
        loss = model(torch.randn(4, 16)).pow(2).mean()
        loss.backward()
        time.sleep(0.05)
        return loss

    profiling.arm()
    cell = profiling._armed
    assert cell is not None
    cell._pre()
    for _ in range(2):
        opt.step(closure)
    cell._post()
    p = profiling.collect()
    assert p is not None
    steps = [s for s in p.spans if s.name.startswith("Optimizer.step")]
    forwards = [s for s in p.spans if s.name == "nn.Module: Sequential"]
    assert len(steps) == len(forwards) == 2
    for step, forward in zip(steps, forwards, strict=True):
        assert step.start_ns > forward.end_ns  # the step's own time: after its closure
        assert step.duration_ns < 50_000_000  # the closure's 50 ms sleep is not the optimizer's
    ops = {s.name for s in p.spans if s.kind is SpanKind.OP}
    assert {"aten::mean", "aten::pow"} <= ops  # the closure's own ops, outside any module


def test_an_attached_rank_profiles_whole_steps_from_the_step_it_is_asked_in(armed: None) -> None:
    hooks = (
        dict(nn_module._global_forward_pre_hooks),
        dict(optimizer_module._global_optimizer_pre_hooks),
    )
    stepped = optimizer_module.register_optimizer_step_post_hook(
        lambda *_: profiling.at_step(0)  # the agent's step hook
    )
    try:
        _train(1)
        assert profiling.report() == Profiled(asked=False)
        profiling.ask(2)
        assert profiling.report() == Profiled(asked=True, steps=0, limit=2)
        _train(1)  # the step it is asked in: the profile starts at its end
        assert profiling.report() == Profiled(asked=True, steps=0, limit=2)
        _train(3)  # a loop of its own makes a model and an optimizer first
        found = profiling.report()
        assert (found.steps, found.limit) == (2, 2) and found.profile is not None
        steps = [s for s in found.profile.spans if s.name.startswith("Optimizer.step")]
        assert len(steps) == 2 and len(found.profile.windows) == 1
        assert found.profile.windows[0][1] >= steps[-1].start_ns  # its last step, whole
        assert profiling.report() == Profiled(asked=False)  # handed over once
        profiling.ask(None)  # until the notebook ends it
        _train(4)
        assert profiling.report(end=True).profile is None  # ends at the next step
        _train(1)
        assert profiling.report().profile is not None
        profiling.ask(None)
        _train(2)
        profiling.drop()  # a detach: dropped at the next step, nothing handed over
        assert profiling.report() == Profiled(asked=False)  # and none to a new notebook now
        _train(1)
        assert profiling.report() == Profiled(asked=False)
    finally:
        stepped.remove()
    assert (
        dict(nn_module._global_forward_pre_hooks),
        dict(optimizer_module._global_optimizer_pre_hooks),
    ) == hooks
    assert not torch._C._autograd._profiler_enabled()


def test_a_profile_without_a_step_count_ends_after_the_most_steps(
    armed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(profiling, "MOST_STEPS", 3)  # 200 of a real profile's: ~0.3 MB a step
    p = _profile(5)
    assert len([s for s in p.spans if s.name.startswith("Optimizer.step")]) == 3
    assert p.steps_limit is None


def test_the_main_threads_cpu_time_is_read_at_each_step(armed: None) -> None:
    """A step that sleeps has the CPU for little of its time; one that computes, for most."""
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    profiling.arm()
    cell = profiling._armed
    assert cell is not None
    cell._pre()
    for sleeping in (True, False):
        began = time.monotonic_ns()
        if sleeping:
            time.sleep(0.05)
        else:
            while time.monotonic_ns() - began < 50_000_000:
                model(torch.randn(64, 256)).sum().backward()
        opt.step()
    cell._post()
    p = profiling.collect()
    assert p is not None and len(p.cpu) == 4  # the window's start, 2 steps, its end
    (t0, c0), (t1, c1), (t2, c2), _ = p.cpu
    assert (c1 - c0) < 0.2 * (t1 - t0)  # asleep: off the CPU
    # computing: on it, as much as a busy machine lets it, far more than asleep
    assert (c2 - c1) > 10 * (c1 - c0) and (c2 - c1) > 0.05 * (t2 - t1)
