"""The rank's side of profiling, in this process with a real `torch.profiler`: spans on the
monotonic clock, modules named forward and backward, the step limit, nothing left once off."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import torch
from torch.nn.modules import module as nn_module

from distnb.rank import profiling
from distnb.records.profiling import RankProfile, SpanKind


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
    names = {s.name for s in _profile(2).spans if s.kind is SpanKind.MODULE}
    assert {"nn.Module: Sequential", "nn.Module: Linear", "nn.Module: ReLU"} <= names
    assert {"nn.Module: Linear (backward)", "nn.Module: ReLU (backward)"} <= names


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
