"""Who is slow and why, from plain records: steps, phases and the straggler's cause."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from distnb.judgement.slowness import (
    Phase,
    breakdown,
    clip,
    label,
    step_bounds,
    subtract,
    union,
)
from distnb.records.codec import decode, encode
from distnb.records.collective import CallSite, CollectiveEvent
from distnb.records.profiling import RankProfile, Span, SpanKind
from distnb.views.profiling import ProfileView

MS = 1_000_000
SITE = CallSite("cell", 3, cell=5)


def job(
    data: Sequence[int],
    compute: Sequence[int],
    steps: int = 3,
    modules: dict[int, list[str]] | None = None,
    ops: Sequence[str] = ("aten::addmm",),
    optimizer: bool = True,
    loader: bool = True,
    warmup: dict[int, int] | None = None,
) -> tuple[list[RankProfile], list[CollectiveEvent]]:
    """Ranks that each load a batch (`data[r]` ms), compute (`compute[r]` ms, in `modules[r]`,
    outermost first, over ops that share it evenly), meet at an all_reduce and step their
    optimizer (1 ms); `warmup[r]` ms more of host time in rank r's first step."""
    ranks = range(len(data))
    spans: dict[int, list[Span]] = {r: [] for r in ranks}
    events: list[CollectiveEvent] = []
    t = 10 * MS
    first = t
    for k in range(steps):
        arrive = {}
        for r in ranks:
            at = t + (warmup or {}).get(r, 0) * MS * (k == 0)
            if loader:
                spans[r].append(
                    Span("enumerate(DataLoader)#_It.__next__", SpanKind.DATA, at, at + data[r] * MS)
                )
            at += data[r] * MS
            end = at + compute[r] * MS
            for depth, name in enumerate((modules or {}).get(r, [])):
                spans[r].append(
                    Span(f"nn.Module: {name}", SpanKind.MODULE, at + depth, end - depth)
                )
            share = (end - at) // len(ops)
            for n, op in enumerate(ops):
                a = at + n * share
                spans[r].append(Span(op, SpanKind.OP, a + 10, a + share - 10))
            arrive[r] = end
        start = max(arrive.values())
        for r in ranks:
            events.append(
                CollectiveEvent(
                    r, "WORLD", k, "all_reduce", 64, SITE, arrive[r], start, start + MS, 1
                )
            )
            if optimizer:
                spans[r].append(
                    Span("Optimizer.step#SGD.step", SpanKind.OPTIMIZER, start + MS, start + 2 * MS)
                )
        t = start + 2 * MS + 100_000  # a little Python between steps
    profiles = [RankProfile(r, tuple(spans[r]), ((first - MS, t),), runs=(1,)) for r in ranks]
    return profiles, events


def test_a_slow_data_loader_names_the_rank_and_its_dataloader() -> None:
    profiles, events = job(data=[9, 52], compute=[5, 5])
    result = breakdown(profiles, events)
    s = result.straggler
    assert s is not None and s.rank == 1 and s.phase is Phase.DATA
    assert s.late_ns == pytest.approx(43 * MS, rel=0.01)
    assert str(s) == (
        "rank 1 is 43.0 ms late per step: its DataLoader's next() takes 52.0 ms against 9.0 ms "
        "on the others"
    )
    assert result.steps_by == "optimizer steps"
    waits = [r.per_step(Phase.WAIT) for r in result.ranks]
    assert waits[0] == pytest.approx(43 * MS, rel=0.01) and waits[1] == 0


def test_a_slow_module_on_one_rank_is_named_rather_than_its_outer_module_or_ops() -> None:
    modules = {0: ["Net"], 1: ["Net", "SlowBlock"]}
    profiles, events = job(data=[2, 2], compute=[5, 35], modules=modules)
    s = breakdown(profiles, events).straggler
    assert s is not None and s.rank == 1 and s.phase is Phase.COMPUTE
    assert s.what == "module: SlowBlock"
    assert "its module SlowBlock takes" in str(s)


def test_a_bigger_batch_names_the_op_that_grew() -> None:
    profiles, events = job(data=[1, 1], compute=[4, 40], ops=["aten::mm"])
    s = breakdown(profiles, events).straggler
    assert s is not None and (s.rank, s.what) == (1, "op: aten::mm")
    assert "its aten::mm takes 40.0 ms against 4.0 ms" in str(s)


def test_a_cause_that_explains_part_of_its_phase_is_said_with_the_phase() -> None:
    profiles, events = job(data=[1, 1], compute=[4, 40], ops=["aten::addmm", "AddmmBackward0"])
    s = breakdown(profiles, events).straggler
    assert s is not None and s.what in ("op: aten::addmm", "op: AddmmBackward0")
    assert str(s).startswith(
        "rank 1 is 36.0 ms late per step: its compute takes 40.0 ms against 4.0 ms on the "
        "others, the most of it in "
    )
    assert str(s).endswith(": 20.0 ms against 2.0 ms")


def test_a_first_step_that_warms_up_does_not_make_a_straggler() -> None:
    profiles, events = job(data=[9, 20], compute=[5, 5], warmup={0: 500})
    s = breakdown(profiles, events).straggler
    assert s is not None and s.rank == 1 and s.phase is Phase.DATA


def test_three_ranks_compare_the_slow_one_with_the_median_of_the_others() -> None:
    profiles, events = job(data=[5, 5, 25], compute=[3, 4, 3])
    s = breakdown(profiles, events).straggler
    assert s is not None and s.rank == 2 and s.peers_ns == pytest.approx(5 * MS, rel=0.01)


def test_even_ranks_have_no_straggler() -> None:
    profiles, events = job(data=[5, 5], compute=[10, 10])
    result = breakdown(profiles, events)
    assert result.straggler is None
    assert result.verdict.startswith("no rank stands out")


def test_each_instant_of_a_step_counts_in_one_phase_only() -> None:
    profiles, events = job(data=[9, 52], compute=[5, 5])
    for r in breakdown(profiles, events).ranks:
        for st in r.steps:
            assert sum(st.phases.values()) == st.end_ns - st.start_ns
            assert st.phases[Phase.COLLECTIVE] == MS and st.phases[Phase.OPTIMIZER] == MS


def test_steps_come_from_data_loader_iterations_without_an_optimizer_then_from_cells() -> None:
    profiles, events = job(data=[9, 30], compute=[5, 5], steps=4, optimizer=False)
    result = breakdown(profiles, events)
    assert result.steps_by == "DataLoader iterations"
    assert [len(r.steps) for r in result.ranks] == [3, 3]  # the last next() starts the tail
    assert result.straggler is not None and result.straggler.phase is Phase.DATA
    profiles, events = job(data=[9, 9], compute=[5, 30], optimizer=False, loader=False)
    result = breakdown(profiles, events)
    assert result.steps_by == "cells" and result.unit == "cell"
    assert result.straggler is not None and "late per cell" in str(result.straggler)


def test_a_window_cut_by_a_step_limit_keeps_the_steps_inside_it() -> None:
    profiles, _ = job(data=[1], compute=[1], steps=3)
    p = profiles[0]
    second_end = sorted(s.end_ns for s in p.spans if s.kind is SpanKind.OPTIMIZER)[1]
    cut = RankProfile(0, p.spans, ((p.windows[0][0], second_end),))
    assert len(step_bounds(cut, "optimizer steps")) == 2


def test_clock_offsets_move_steps_but_not_phases() -> None:
    profiles, events = job(data=[9, 52], compute=[5, 5])
    moved = breakdown(profiles, events, {1: 7 * MS})
    plain = breakdown(profiles, events)
    assert moved.ranks[1].steps[0].start_ns == plain.ranks[1].steps[0].start_ns + 7 * MS
    assert moved.ranks[1].steps[0].phases == plain.ranks[1].steps[0].phases


def test_a_late_rank_within_the_clocks_precision_is_not_named() -> None:
    profiles, events = job(data=[9, 12], compute=[5, 5])
    assert breakdown(profiles, events).straggler is not None
    assert breakdown(profiles, events, precision_ns=5 * MS).straggler is None


def test_intervals_are_merged_and_subtracted() -> None:
    assert union([(5, 8), (1, 3), (2, 4), (8, 9)]) == [(1, 4), (5, 9)]
    assert subtract([(0, 10), (20, 30)], [(2, 3), (5, 22), (29, 40)]) == [
        (0, 2),
        (3, 5),
        (22, 29),
    ]


def test_intervals_are_clipped_to_a_step() -> None:
    spans = [(0, 5), (10, 20), (30, 40)]
    assert clip(spans, 12, 35) == [(12, 20), (30, 35)]
    assert clip(spans, -5, 3) == [(0, 3)]
    assert clip(spans, 5, 10) == []
    assert clip(spans, 10, 10) == []
    assert clip(spans, 41, 50) == []
    assert clip(spans, 0, 100) == spans
    assert clip([], 0, 1) == []


def test_a_span_across_steps_counts_in_each_as_far_as_it_overlaps_it() -> None:
    """Each span is matched only with the steps near it (a bisection, not a scan of every step
    for every span): the names per step equal a scan's, for spans inside one step, across two
    and across all, and for steps cut out of several windows."""
    profiles, events = job(data=[9, 12], compute=[5, 5], steps=6)
    p = profiles[1]
    bounds = step_bounds(p, "optimizer steps")
    (w0, w1) = p.windows[0]
    middle = (w0 + w1) // 2
    extra = (
        Span("aten::long", SpanKind.OP, bounds[1][1] - MS, bounds[3][0] + MS),  # steps 1-3
        Span("aten::all", SpanKind.OP, w0 - MS, w1 + MS),  # every step, and outside them
    )
    windows = ((w0, middle), (middle, w1))  # two cells
    whole = RankProfile(1, (*p.spans, *extra), windows, runs=(1, 2))
    result = breakdown([profiles[0], whole], events)
    steps = result.ranks[1].steps
    scanned = step_bounds(whole, "optimizer steps")
    assert len(steps) == len(scanned) >= 4
    for st, (a, b) in zip(steps, scanned, strict=True):
        expected: dict[str, int] = {}
        for span in whole.spans:
            overlap = min(span.end_ns, b) - max(span.start_ns, a)
            if overlap > 0 and span.kind is not SpanKind.COMM:
                expected[label(span)] = expected.get(label(span), 0) + overlap
        assert st.names == expected
    assert steps[2].names["op: aten::long"] == steps[2].end_ns - steps[2].start_ns
    assert all(st.names["op: aten::all"] == st.end_ns - st.start_ns for st in steps)


def test_a_profile_crosses_processes_as_json() -> None:
    profiles, _ = job(data=[1], compute=[1], steps=1)
    p = profiles[0]
    assert decode(RankProfile, json.loads(json.dumps(encode(p)))) == p


def test_the_view_says_it_in_text_html_and_one_trace_of_all_ranks(tmp_path: Path) -> None:
    profiles, events = job(data=[9, 52], compute=[5, 5])
    view = ProfileView(profiles, events, {1: 3 * MS})
    text = repr(view)
    assert "profile of 2 ranks, 3 optimizer steps each" in text
    assert "rank 1 is 43.0 ms late per step" in text
    assert 'class="distnb-straggler"' in view._repr_html_()
    view.export_chrome_trace(tmp_path / "p.json")
    trace = json.loads((tmp_path / "p.json").read_text())["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in trace if e["name"] == "process_name"}
    assert names == {(0, "rank 0"), (1, "rank 1")}
    lanes = {e["args"]["name"] for e in trace if e["name"] == "thread_name"}
    assert {"steps", "collectives (distnb)", "thread 0"} <= lanes
    # the all_reduce starts at one instant on every rank: the offset moves rank 1's lanes
    starts = {e["pid"]: e["ts"] for e in trace if e["name"] == "all_reduce"}
    assert starts[1] - starts[0] == pytest.approx(3000)


def test_the_share_of_collectives_beside_the_ranks_own_ops_is_its_overlap() -> None:
    profiles, events = job(data=[5, 5], compute=[5, 5])
    # rank 0's backward goes on for the first half of each all_reduce (DDP's buckets)
    late = [
        Span("autograd::engine::evaluate_function: AddmmBackward0", SpanKind.OP, e.start_ns,
             e.start_ns + MS // 2)
        for e in events if e.rank == 0
    ]  # fmt: skip
    profiles[0] = replace(profiles[0], spans=profiles[0].spans + tuple(late))
    result = breakdown(profiles, events)
    assert result.ranks[0].overlap == pytest.approx(0.5)
    assert result.ranks[1].overlap == 0.0  # its ops ended before the all_reduce began
    assert [s.comm_ns for s in result.ranks[1].steps] == [MS] * 3
    text = repr(ProfileView(profiles, events))
    assert "comm/compute overlap" in text.splitlines()[1]
    assert [line.split()[-1] for line in text.splitlines()[2:4]] == ["50%", "0%"]
    no_collectives = breakdown(profiles, [])
    assert no_collectives.ranks[0].overlap is None


def _with_cpu(profile: RankProfile, per_step_ms: float) -> RankProfile:
    """`profile` with its main thread's CPU clock read at its window's start and each step's
    end, `per_step_ms` of CPU a step."""
    ends = sorted(s.end_ns for s in profile.spans if s.name.startswith("Optimizer.step"))
    samples = [(profile.windows[0][0], 0)]
    samples += [(t, int((i + 1) * per_step_ms * MS)) for i, t in enumerate(ends)]
    return replace(profile, cpu=tuple(samples))


def test_ops_slower_on_no_more_cpu_say_the_ranks_cores_are_shared() -> None:
    profiles, events = job(data=[1, 1], compute=[5, 10])  # rank 1's ops take twice as long
    shared = [_with_cpu(profiles[0], 5), _with_cpu(profiles[1], 5.2)]  # on the same CPU time
    s = breakdown(shared, events).straggler
    assert s is not None and (s.rank, s.phase) == (1, Phase.COMPUTE), str(s)
    assert s.cpu_mine_ns == pytest.approx(5.2 * MS) and s.cpu_peers_ns == pytest.approx(5 * MS)
    assert str(s).endswith(
        "its ops ran slower with no more CPU time than the others' (5.2 ms against 5.0 ms per "
        "step): something else runs on its cores"
    )
    more_work = [_with_cpu(profiles[0], 5), _with_cpu(profiles[1], 10)]  # a bigger batch
    assert breakdown(more_work, events).straggler.cpu_mine_ns == 0  # type: ignore[union-attr]
    assert "cores" not in str(breakdown(profiles, events).straggler)  # no CPU clock read
