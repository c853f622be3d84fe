"""Overflow records and the cross-rank summary: pure, milliseconds."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from distnb.records.overflow import (
    CrossRankSummary,
    Frame,
    Phase,
    RankOverflowReport,
    Stats,
    StepOn,
    WatchOptions,
    summarize,
)


def frame(step: int = 0, order: int = 0, *, bad: bool = False, **kw: object) -> Frame:
    base: dict[str, object] = {
        "step": step,
        "micro": 0,
        "order": order,
        "module": "layers.2",
        "cls": "Linear",
        "phase": Phase.FORWARD,
        "name": "output",
        "dtype": "float16",
        "compute_dtype": "float16",
        "numel": 64,
        "abs_min": 0.0 if bad else 0.5,
        "abs_max": math.inf if bad else 2.0,
        "min_nonzero": 0.5,
        "nan": 0,
        "inf": 3 if bad else 0,
        "zeros": 1 if bad else 0,
        "under": 0,
        "headroom_bits": None if bad else 15.0,
        "readback_ns": 1_000,
    }
    return Frame(**{**base, **kw})  # type: ignore[arg-type]


def report(rank: int, first: Frame | None, **kw: object) -> RankOverflowReport:
    ring = (frame(), first) if first else (frame(),)
    return RankOverflowReport(rank, steps=3, readbacks=3, first=first, ring=ring, **kw)  # type: ignore[arg-type]


def test_first_rank_is_the_earliest_step_then_order() -> None:
    reports = [
        report(0, frame(step=1, order=0, bad=True, module="layers.0", name="weight")),
        report(1, frame(step=0, order=7, bad=True)),
        report(2, frame(step=0, order=9, bad=True, phase=Phase.GRAD, name="weight.grad")),
        report(3, None),
    ]
    s = summarize(reports)
    assert s.first_rank == 1 and s.origin == (1,)
    assert s.received == (0, 2) and s.clean == (3,)
    assert s.first is not None and s.first.order == 7
    text = str(s)
    assert text.splitlines()[0] == (
        "rank 1 went non-finite first: step 0, layers.2 (Linear) forward output: "
        "0 NaN, 3 Inf of 64 values."
    )
    assert "rank 0 received it later (likely through a collective): step 1" in text
    assert text.endswith("Still finite: rank 3.")


def test_ranks_bad_at_the_same_point_are_all_origins_and_the_clock_breaks_the_tie() -> None:
    a = frame(step=2, order=4, bad=True, readback_ns=2_000)
    b = replace(a, readback_ns=1_500)
    s = summarize([report(0, a), report(1, b)])
    assert s.first_rank == 1 and s.origin == (0, 1) and s.received == ()
    assert str(s).startswith("ranks 0-1 went non-finite first: step 2")


def test_micro_step_orders_before_order() -> None:
    early = frame(step=0, order=50, bad=True)
    late = frame(step=0, order=1, bad=True, micro=1)
    assert summarize([report(0, late), report(1, early)]).first_rank == 1


def test_all_finite() -> None:
    s = summarize([report(1, None), report(0, None)])
    assert s.first_rank is None and s.first is None and s.clean == (0, 1)
    assert str(s) == "No non-finite values on ranks 0-1."


def test_frame_properties() -> None:
    f = frame(bad=True, nan=None, inf=None)
    assert f.nonfinite and f.describe() == "Inf among 64 values (counts not measured)"
    assert f.where == "layers.2 (Linear) forward output"
    g = frame(numel=10, zeros=2, under=4)
    assert g.underflow_share == 0.5 and not g.nonfinite
    assert replace(g, module="").where == "<root> (Linear) forward output"


def test_records_round_trip_through_strict_json() -> None:
    nan_frame = frame(bad=True, abs_max=math.nan, abs_min=math.nan, min_nonzero=None)
    r = report(
        1,
        nan_frame,
        traced=(frame(order=1), frame(order=2, phase=Phase.BACKWARD, name="grad_output")),
        headroom=(frame(headroom_bits=1.5),),
        stopped="nonfinite",
        stats=Stats.FULL,
    )
    text = json.dumps(r.to_dict(), allow_nan=False)
    back = RankOverflowReport.from_dict(json.loads(text))
    assert back.first is not None and math.isnan(back.first.abs_max)
    assert replace(back, first=None, ring=()) == replace(r, first=None, ring=())
    assert back.ring[0] == r.ring[0] and back.first.phase is Phase.FORWARD
    s = summarize([r, report(0, frame(step=5, bad=True))])
    s_back = CrossRankSummary.from_dict(json.loads(json.dumps(s.to_dict(), allow_nan=False)))
    assert (s_back.first_rank, s_back.received, s_back.ranks) == (1, (0,), (0, 1))


def test_watch_options_are_validated_once_into_enums() -> None:
    o = WatchOptions.of(
        phases=["grad", "forward"], trace_batches=[3, 1, 3], stats="auto", step_on="explicit"
    )
    assert o.phases == (Phase.FORWARD, Phase.GRAD)  # in step order, whatever order was asked
    assert (o.trace_batches, o.stats, o.step_on) == ((1, 3), Stats.AUTO, StepOn.EXPLICIT)
    assert o.validated() == o and WatchOptions().validated().stats is Stats.FAST
    assert WatchOptions.from_dict(json.loads(json.dumps(o.to_dict()))) == o
    assert str(Stats.FULL) == "full" and f"{Stats.AUTO} statistics" == "auto statistics"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"stats": "everything"}, "stats must be one of 'fast', 'auto', 'full'; got 'everything'"),
        ({"phases": ("forwards",)}, "phases must be some of 'forward', 'backward', 'grad'"),
        ({"phases": ()}, "phases must be some of"),
        ({"phases": "forward"}, "phases must be a list; got 'forward'"),
        ({"frames": 0}, "frames must be a whole number >= 1; got 0"),
        ({"trace_batches": [-1]}, "trace_batches must be a whole number >= 0; got -1"),
        ({"abort_after": 1.5}, "abort_after must be a whole number >= 0; got 1.5"),
        ({"headroom_warn_bits": -1}, "headroom_warn_bits must be a number >= 0; got -1"),
        ({"step_on": "backward"}, "step_on must be one of 'forward', 'explicit'"),
        ({"stop_on_nonfinite": "yes"}, "stop_on_nonfinite must be True or False; got 'yes'"),
        ({"frame": 3}, "unknown overflow option(s) frame; known: frames, trace_batches"),
    ],
)
def test_bad_watch_options_name_the_option_the_range_and_the_value(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError) as info:
        WatchOptions.of(**options)
    assert message in str(info.value)
