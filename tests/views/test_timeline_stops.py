"""Time a rank sat stopped in a debugger is not waiting: the timeline's numbers and text."""

from __future__ import annotations

from distnb.records.collective import CallSite, CollectiveEvent
from distnb.records.debug import DebugStop
from distnb.views.timeline import TimelineView
from distnb.views.timeline.model import build_timeline

MS = 1_000_000
S = 1_000 * MS


def ev(rank: int, seq: int, arrive: int) -> CollectiveEvent:
    site = CallSite("/tmp/ipykernel_1/7.py", 3, cell=7, code="dist.all_reduce(x)")
    return CollectiveEvent(rank, "WORLD", seq, "all_reduce", 64, site, arrive, arrive, arrive, 7, 2)


def debugged() -> tuple[list[CollectiveEvent], list[DebugStop]]:
    """Rank 1 sits 45 s at a breakpoint before collective 0 and arrives 45.002 s after rank 0;
    at collective 1 it straggles 3 ms with no debugger."""
    events = [ev(0, 0, 1 * MS), ev(1, 0, 45 * S + 3 * MS)]
    events += [ev(0, 1, 46 * S), ev(1, 1, 46 * S + 3 * MS)]
    return events, [DebugStop(1, 2 * MS, 45 * S + 2 * MS, 7)]


def test_a_wait_for_a_rank_in_the_debugger_is_counted_apart() -> None:
    events, stops = debugged()
    tl = build_timeline(events, stops=stops)
    first, second = tl.collectives
    rank0 = first.slots[0]
    assert rank0.stopped_wait_ns == 45 * S  # the whole stop fell inside rank 0's wait
    assert rank0.wait_ns == 2 * MS  # the rest: rank 1 was late by 2 ms of its own
    assert first.total_wait_ns == 2 * MS and first.stopped_wait_ns == 45 * S
    assert first.lead_ns == 2 * MS  # not 45 s
    assert second.total_wait_ns == 3 * MS and second.stopped_wait_ns == 0
    by_rank = {s.rank: s for s in tl.stragglers}
    assert by_rank[1].wait_caused_ns == 5 * MS  # 2 ms + 3 ms, not 45 s
    assert by_rank[1].stopped_ns == 45 * S and by_rank[0].stopped_ns == 0
    assert by_rank[0].own_wait_ns == 5 * MS
    assert tl.stopped_ns == 45 * S


def test_without_stops_the_wait_is_all_waiting() -> None:
    events, _ = debugged()
    first = build_timeline(events).collectives[0]
    assert first.total_wait_ns == 45 * S + 2 * MS and first.stopped_wait_ns == 0


def test_stops_of_the_waiting_rank_itself_or_outside_the_wait_do_not_count() -> None:
    events = [ev(0, 0, 10 * MS), ev(1, 0, 20 * MS)]
    stops = [DebugStop(0, 0, 9 * MS, 7), DebugStop(1, 0, 5 * MS, 7)]
    stops.append(DebugStop(1, 25 * MS, 30 * MS, 7))
    first = build_timeline(events, stops=stops).collectives[0]
    assert first.slots[0].wait_ns == 10 * MS and first.stopped_wait_ns == 0


def test_overlapping_stops_are_counted_once() -> None:
    events = [ev(0, 0, 0), ev(1, 0, 10 * MS)]
    stops = [DebugStop(1, 1 * MS, 6 * MS, 7), DebugStop(1, 4 * MS, 8 * MS, 7)]
    first = build_timeline(events, stops=stops).collectives[0]
    assert first.slots[0].stopped_wait_ns == 7 * MS and first.slots[0].wait_ns == 3 * MS


def test_the_text_says_stopped_in_a_debugger_not_waiting() -> None:
    events, stops = debugged()
    text = repr(TimelineView(events, stops=stops))
    assert (
        "Stopped in a debugger: rank 1, 45.00 s; the others' wait meanwhile, 45.00 s, is not "
        "counted as waiting or as wait caused"
    ) in text, text
    lines = text.splitlines()
    header = lines.index("Stragglers (arrived last; the others' wait for it):") + 1
    assert lines[header].split("  ")[-1] == "stopped in a debugger"
    assert lines[header + 1].split() == ["1", "2", "5.00", "ms", "0", "ns", "45.00", "s"]
    html = TimelineView(events, stops=stops)._repr_html_()
    assert "Stopped in a debugger: rank 1" in html
    assert "stopped in a debugger 45.00 s" in html  # the first collective's tooltip
