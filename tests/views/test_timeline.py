"""Collective timelines from synthetic events: analysis, renderings and Chrome-trace export."""

from __future__ import annotations

import ast
import dataclasses
import itertools
import json
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import distnb.views.timeline
from distnb.records.collective import CallSite, CollectiveEvent
from distnb.views.timeline import TimelineView
from distnb.views.timeline.chrome import chrome_trace
from distnb.views.timeline.model import ClockOffsets, build_timeline, bus_factor, nccl_bytes

MS = 1_000_000
US = 1_000


def ev(
    rank: int,
    seq: int,
    arrive: int,
    *,
    op: str = "all_reduce",
    group: str = "WORLD",
    start: int | None = None,
    dur: int = 100 * US,
    nbytes: int = 1 << 20,
    n: int = 2,
    line: int = 3,
) -> CollectiveEvent:
    s = start if start is not None else arrive
    site = CallSite("/tmp/ipykernel_1/7.py", line, cell=7, code=f"dist.{op}(x)")
    return CollectiveEvent(rank, group, seq, op, nbytes, site, arrive, s, s + dur, 7, n)


def straggling(n_coll: int = 6, n_ranks: int = 3, slow: int = 2) -> list[CollectiveEvent]:
    """Rank `slow` arrives 5 ms after the others every time; data moves once all are in."""
    out = []
    for seq in range(n_coll):
        t = seq * 20 * MS
        arrive = {r: t + r * US + (5 * MS if r == slow else 0) for r in range(n_ranks)}
        start = max(arrive.values()) + 10 * US
        out += [ev(r, seq, arrive[r], start=start, n=n_ranks) for r in range(n_ranks)]
    return out


def test_straggler_is_named_and_waits_are_measured_to_the_last_arrival() -> None:
    tl = build_timeline(straggling())
    c = tl.collectives[0]
    assert c.last_rank == 2
    assert [s.wait_ns for s in c.slots] == [5 * MS + 2 * US, 5 * MS + US, 0]
    assert c.lead_ns == 5 * MS + US
    top = tl.stragglers[0]
    assert (top.rank, top.times_last) == (2, 6)
    assert top.wait_caused_ns == 6 * (10 * MS + 3 * US)
    assert top.own_wait_ns == 0
    assert {s.rank: s.times_last for s in tl.stragglers} == {0: 0, 1: 0, 2: 6}


def test_collectives_group_by_group_and_seq_in_arrival_order() -> None:
    events = [ev(0, 0, 0, group="g1"), ev(1, 0, 10, group="g1"), ev(0, 0, 5), ev(1, 0, 6)]
    tl = build_timeline(reversed(events))
    assert [(c.group, c.seq) for c in tl.collectives] == [("g1", 0), ("WORLD", 0)]
    assert tl.groups == ("WORLD", "g1")  # WORLD first, then the order of first use
    assert tl.n_events == 4


def test_duration_is_the_mean_data_time_and_feeds_algbw() -> None:
    events = [ev(0, 0, 0, start=50 * US, dur=100 * US), ev(1, 0, 50 * US, dur=300 * US)]
    c = build_timeline(events).collectives[0]
    assert c.duration_ns == 200 * US
    assert c.algbw_gbps == pytest.approx((1 << 20) / (200 * US))
    assert c.busbw_gbps == pytest.approx(c.algbw_gbps * 2 * (2 - 1) / 2)  # type: ignore[operator]


@pytest.mark.parametrize(
    ("op", "n", "factor"),
    [
        ("all_reduce", 4, 2 * 3 / 4),
        ("all_reduce", 8, 2 * 7 / 8),
        ("all_gather", 4, 3 / 4),
        ("all_gather_into_tensor", 8, 7 / 8),
        ("reduce_scatter_tensor", 4, 3 / 4),
        ("all_to_all_single", 4, 3 / 4),
        ("broadcast", 8, 1.0),
        ("reduce", 8, 1.0),
        ("send", 2, 1.0),
        ("barrier", 4, None),
    ],
)
def test_busbw_factors_follow_nccl_tests(op: str, n: int, factor: float | None) -> None:
    assert bus_factor(op, n) == (None if factor is None else pytest.approx(factor))


def test_nccl_bytes_counts_the_gathered_output_for_gathers() -> None:
    assert nccl_bytes("all_gather_into_tensor", 1000, 4) == 4000
    assert nccl_bytes("all_reduce", 1000, 4) == 1000
    assert nccl_bytes("reduce_scatter_tensor", 4000, 4) == 4000


def test_per_op_table_sums_counts_bytes_and_weights_bandwidth() -> None:
    events = straggling(n_coll=4, n_ranks=2, slow=1)
    events += [
        ev(r, 10 + r * 0, 100 * MS, op="all_gather_into_tensor", nbytes=1000) for r in range(2)
    ]
    ops = {s.op: s for s in build_timeline(events).ops}
    ar, ag = ops["all_reduce"], ops["all_gather_into_tensor"]
    assert (ar.count, ar.nbytes, ar.timed, ar.time_ns) == (4, 4 << 20, 4, 400 * US)
    assert ar.busbw_gbps == pytest.approx(ar.algbw_gbps)  # 2(n-1)/n = 1 for n = 2
    assert ag.nbytes == 2000  # 2 ranks x 1000 bytes gathered
    assert ag.busbw_gbps == pytest.approx(2000 / (100 * US) / 2)


def test_unknown_end_leaves_duration_and_bandwidth_unknown() -> None:
    events = [ev(r, 0, 0) for r in range(2)]
    events = [
        CollectiveEvent(**{**{f: getattr(e, f) for f in e.__slots__}, "end_ns": 0}) for e in events
    ]
    tl = build_timeline(events)
    assert tl.collectives[0].duration_ns is None and tl.collectives[0].algbw_gbps is None
    assert tl.ops[0].algbw_gbps is None
    assert "-" in repr(TimelineView(events))


def test_offsets_align_clocks_and_precision_hides_small_leads() -> None:
    # Rank 1's clock runs 1 ms ahead: raw, it looks 1 ms late; aligned, it is 20 µs late.
    events = [ev(0, 0, 0), ev(1, 0, MS + 20 * US)]
    raw = build_timeline(events)
    assert raw.collectives[0].slots[0].wait_ns == MS + 20 * US
    aligned = build_timeline(events, ClockOffsets({1: -MS}, precision_ns=50 * US))
    assert aligned.collectives[0].slots[0].wait_ns == 20 * US
    assert aligned.collectives[0].last_rank == 1
    assert all(s.times_last == 0 for s in aligned.stragglers)  # 20 µs < ±50 µs
    assert "±50 µs" in aligned.clock_note
    assert build_timeline(events, {1: -MS}).collectives[0].slots[0].wait_ns == 20 * US


def test_incomplete_collective_is_reported() -> None:
    events = [ev(0, 0, 0, n=3), ev(1, 0, 10, n=3)]
    tl = build_timeline(events)
    assert not tl.collectives[0].complete
    assert "2 of 3 ranks" in repr(TimelineView(events))


def test_text_names_the_straggler_and_the_call_site() -> None:
    text = repr(TimelineView(straggling()))
    assert "6 collectives (18 events) on ranks 0-2, groups WORLD" in text
    lines = text.splitlines()
    row = lines[lines.index("Stragglers (arrived last; the others' wait for it):") + 2]
    assert row.split()[:2] == ["2", "6"]
    assert "cell In[7] line 3: dist.all_reduce(x)" in text
    assert "all_reduce" in text and "busbw GB/s" in text


def test_empty_timeline_renders() -> None:
    view = TimelineView([])
    assert "no collectives recorded" in repr(view)
    ET.fromstring(_svg(view._repr_html_()))
    assert chrome_trace(view.timeline)["traceEvents"] == []


def _svg(html: str) -> str:
    return html[html.index("<svg") : html.index("</svg>") + len("</svg>")]


def test_html_has_svg_with_call_site_tooltips_and_tables() -> None:
    events = straggling() + [ev(r, 0, 0, group="g1", line=9) for r in range(2)]
    html = TimelineView(events)._repr_html_()
    svg = ET.fromstring(_svg(html))
    ns = "{http://www.w3.org/2000/svg}"
    titles = [t.text or "" for t in svg.iter(f"{ns}title")]
    assert len(titles) == 7  # one per collective
    assert any("last: rank 2" in t and "cell In[7] line 3: dist.all_reduce(x)" in t for t in titles)
    assert any("pattern" in el.tag for el in svg.iter())  # hatched waits
    assert "Stragglers" in html and "Per op" in html and "<script" not in html


def test_png_is_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "timeline.png"
    TimelineView(straggling()).savefig(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_widget_lists_collectives_and_shows_call_sites() -> None:
    pytest.importorskip("ipywidgets")
    box = TimelineView(straggling()).widget()
    _heading, controls, drawing, count, listing, detail, _tables = box.children
    rank_dd, op_dd, _group_dd, _order_dd = controls.children
    assert count.value == "6 collectives" and "<svg" in drawing.value
    listing.index = 0
    assert "rank 2 (last)" in detail.value and "dist.all_reduce(x)" in detail.value
    assert 'stroke="#000"' in drawing.value  # the selected collective is outlined
    op_dd.value = "all"
    rank_dd.value = "1"
    assert "rank 0" not in drawing.value


# -- Chrome trace: a small schema of the trace-event format ---------------------------------

PHASES = {"X", "M", "B", "E", "i", "I", "C"}
METADATA = {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}


def check_trace_schema(trace: dict[str, Any]) -> None:
    """Required keys and types per phase, as chrome://tracing and Perfetto read them."""
    assert isinstance(trace["traceEvents"], list)
    assert trace.get("displayTimeUnit", "ms") in {"ms", "ns"}
    for e in trace["traceEvents"]:
        assert e["ph"] in PHASES, e
        assert isinstance(e["name"], str) and e["name"], e
        assert type(e["pid"]) is int and type(e["tid"]) is int, e
        if e["ph"] == "M":
            assert e["name"] in METADATA, e
            key = "name" if e["name"].endswith("_name") else "sort_index"
            assert isinstance(e["args"][key], str if key == "name" else int), e
        if e["ph"] == "X":
            assert isinstance(e["ts"], int | float) and not isinstance(e["ts"], bool), e
            assert isinstance(e["dur"], int | float) and e["dur"] >= 0, e
            assert isinstance(e.get("args", {}), dict), e


def complete_events(trace: dict[str, Any], name: str | None = None) -> list[dict[str, Any]]:
    return [
        e
        for e in trace["traceEvents"]
        if e["ph"] == "X" and (name is None or (e["name"] == "wait") == (name == "wait"))
    ]


def check_nesting(events: Sequence[dict[str, Any]]) -> None:
    """Complete events on one thread must nest or be disjoint."""
    by_thread: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in events:
        by_thread.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_thread.values():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end - 1e-6


def test_chrome_trace_is_valid_with_every_event_and_a_process_per_rank(tmp_path: Path) -> None:
    events = straggling() + [ev(r, 0, 0, group="g1") for r in range(2)]
    path = tmp_path / "trace.json"
    TimelineView(events).export_chrome_trace(path)
    trace = json.loads(path.read_text())
    check_trace_schema(trace)
    ops = complete_events(trace, "op")
    assert len(ops) == len(events)
    assert {(e["pid"], e["args"]["group"], e["args"]["seq"]) for e in ops} == {
        (e.rank, e.group, e.seq) for e in events
    }
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    names = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1", 2: "rank 2"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in ops} <= set(threads)
    assert set(threads.values()) == {"WORLD", "g1"}
    first = next(
        e for e in ops if e["pid"] == 0 and e["args"]["seq"] == 0 and e["args"]["group"] == "WORLD"
    )
    assert first["args"]["call_site"] == "cell In[7] line 3" and first["args"]["bytes"] == 1 << 20
    assert first["dur"] == pytest.approx(100.0)  # µs


def test_chrome_trace_wait_precedes_its_collective() -> None:
    trace = chrome_trace(build_timeline(straggling(n_coll=1)))
    waits = complete_events(trace, "wait")
    ops = {e["pid"]: e for e in complete_events(trace, "op")}
    assert {w["pid"] for w in waits} == {0, 1}  # the last rank does not wait
    for w in waits:
        assert w["ts"] + w["dur"] <= ops[w["pid"]]["ts"] + 1e-6
        assert w["args"]["waiting_for_rank"] == 2
    assert waits[0]["dur"] == pytest.approx(5002.0)


def test_overlapping_async_collectives_go_to_separate_threads() -> None:
    # Two async all_reduces in flight at once on each rank.
    events = [ev(r, s, s * 10 * US, dur=500 * US) for r in range(2) for s in range(2)]
    trace = chrome_trace(build_timeline(events))
    check_trace_schema(trace)
    check_nesting(complete_events(trace))
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert names == {"WORLD", "WORLD (overlap 1)"}


def test_big_jobs_sum_the_quiet_ranks_in_one_straggler_line() -> None:
    text = repr(TimelineView(straggling(n_coll=2, n_ranks=12, slow=5)))
    lines = text.splitlines()
    head = lines.index("Stragglers (arrived last; the others' wait for it):")
    assert lines[head + 2].split()[:2] == ["5", "2"]
    assert lines[head + 10].split()[:3] == ["4", "more", "0"]


def test_clock_offsets_round_trip_through_json() -> None:
    offsets = ClockOffsets({0: 0, 1: -41_000}, precision_ns=20_000)
    assert ClockOffsets.from_dict(json.loads(json.dumps(offsets.to_dict()))) == offsets


def test_duplicate_events_count_once_and_unstarted_collectives_draw() -> None:
    e0, e1 = ev(0, 0, 0), ev(1, 0, 10 * US)
    never = CollectiveEvent(
        **{**{f: getattr(e0, f) for f in e0.__slots__}, "start_ns": 0, "end_ns": 0}
    )
    tl = build_timeline([e0, e0, e1])
    assert len(tl.collectives[0].slots) == 2
    c = build_timeline([never]).collectives[0]
    assert c.slots[0].start_ns == 0 and c.duration_ns is None
    check_trace_schema(chrome_trace(build_timeline([never, e1])))


def imported_modules(source: str) -> set[str]:
    """Every module an `import` or `from ... import` names, at any level of the file."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_the_facade_imports_its_renderers_and_none_imports_it() -> None:
    package = Path(distnb.views.timeline.__file__).parent
    renderers = [p for p in package.glob("*.py") if p.name != "__init__.py"]
    assert {p.stem for p in renderers} >= {"model", "summary", "svg", "mpl", "chrome", "widget"}
    for path in renderers:
        assert "distnb.views.timeline" not in imported_modules(path.read_text()), path.name


def test_origins_show_beside_call_sites() -> None:
    bucket = "DDP gradient bucket 0 (fc.bias, fc.weight)"
    events = [dataclasses.replace(e, origin=bucket) if e.rank == 2 else e for e in straggling()]
    view = TimelineView(events)
    assert f"dist.all_reduce(x) [{bucket}]" in repr(view)  # the straggler's site, in the text
    assert f"[{bucket}]" in view._repr_html_()  # and in the drawing's tooltips


def test_ranks_on_several_hosts_are_labelled_with_their_host() -> None:
    events = straggling(n_coll=3, n_ranks=2, slow=1)
    view = TimelineView(events, ClockOffsets({0: 0, 1: 0}, precision_ns=1000), {0: "n1", 1: "n2"})
    text = repr(view)
    assert "rank 1 (n2)" in text
    trace = chrome_trace(view.timeline)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert names == {"rank 0 (n1)", "rank 1 (n2)"}
    one_host = TimelineView(events, None, {0: "n1", 1: "n1"})
    assert "(n1)" not in repr(one_host)
