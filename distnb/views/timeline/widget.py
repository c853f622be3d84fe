"""The interactive timeline: selectors, the SVG drawing, a collective list and its call sites.

Selection goes through widgets rather than matplotlib pick events, which need an interactive
backend; this works in JupyterLab and classic Notebook with the default inline backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from distnb.ranklist import format_ranks
from distnb.views._format import esc, format_bytes, format_ns, html_table
from distnb.views.grouping import span
from distnb.views.timeline.layout import rank_groups
from distnb.views.timeline.model import Collective, RankSlot, Timeline
from distnb.views.timeline.summary import render_heading_html, render_tables_html
from distnb.views.timeline.svg import render_svg

__all__ = ["build_widget", "collective_label", "detail_html", "select_collectives", "slot_rows"]

ALL = "all"
MAX_LISTED = 500  # collectives in the list: a Select with 10,000 options is sluggish
SLOT_HEADER = ["rank", "arrived", "waited", "duration", "bytes", "call site", "code"]


def select_collectives(
    tl: Timeline, rank: int | None, op: str | None, group: str | None, order: str
) -> list[Collective]:
    """Collectives matching the selectors; `order` is "time" or "wait" (longest first)."""
    out = [
        c
        for c in tl.collectives
        if (op is None or c.op == op)
        and (group is None or c.group == group)
        and (rank is None or any(s.rank == rank for s in c.slots))
    ]
    if order == "wait":
        out.sort(key=lambda c: -c.total_wait_ns)
    return out


def collective_label(c: Collective) -> str:
    return (
        f"{c.group} #{c.seq} {c.op} {format_bytes(c.nbytes)} · last rank {c.last_rank} "
        f"· waits {format_ns(c.total_wait_ns)} · {c.site}"
    )


def slot_rows(c: Collective, lanes: Sequence[tuple[int, ...]] = ()) -> list[list[str]]:
    """One row per rank: when it arrived (after the first), its wait and its call site; with
    `lanes` (the ranks that share a lane, from `GROUP_FROM` ranks on), one row per lane, with
    the range of its ranks' times."""
    if lanes:
        where = {r: i for i, lane in enumerate(lanes) for r in lane}
        by_lane: dict[int, list[RankSlot]] = {}
        for s in c.slots:
            by_lane.setdefault(where.get(s.rank, -1 - s.rank), []).append(s)
        return [_lane_row(c, slots) for slots in by_lane.values()]
    first = c.first_arrive_ns
    return [
        [
            f"rank {s.rank}" + (" (last)" if s.rank == c.last_rank else ""),
            "+" + format_ns(s.arrive_ns - first),
            format_ns(s.wait_ns),
            "unknown" if s.end_ns is None else format_ns(s.end_ns - s.start_ns),
            format_bytes(s.nbytes),
            str(s.site),
            s.site.code.strip(),
        ]
        for s in c.slots
    ]


def _lane_row(c: Collective, slots: Sequence[RankSlot]) -> list[str]:
    """The ranks of one lane in one row: `+1.0 µs-+7.0 µs` where their times differ."""

    def spread(values: Sequence[int], prefix: str = "") -> str:
        lo, hi = prefix + format_ns(min(values)), prefix + format_ns(max(values))
        return lo if lo == hi else f"{lo}-{hi}"

    ranks = [s.rank for s in slots]
    ends = [s.end_ns - s.start_ns for s in slots if s.end_ns is not None]
    return [
        format_ranks(ranks) + (" (last)" if c.last_rank in ranks else ""),
        spread([s.arrive_ns - c.first_arrive_ns for s in slots], "+"),
        spread([s.wait_ns for s in slots]),
        spread(ends) if len(ends) == len(slots) else "unknown",
        span([format_bytes(s.nbytes) for s in slots]),
        span([str(s.site) for s in slots]),
        span([s.site.code.strip() for s in slots]),
    ]


def build_widget(tl: Timeline) -> Any:
    """An `ipywidgets.VBox`: heading, selectors, drawing, collective list, call sites, tables."""
    return _TimelineWidget(tl).box


def _chosen(dropdown: Any) -> str | None:
    return None if dropdown.value == ALL else str(dropdown.value)


class _TimelineWidget:
    """The widgets of one timeline and the callbacks that keep them in step."""

    def __init__(self, tl: Timeline) -> None:
        import ipywidgets as w  # views are the only place ipywidgets is imported, lazily

        def dropdown(label: str, values: Sequence[object]) -> Any:
            return w.Dropdown(options=[ALL, *map(str, values)], value=ALL, description=label)

        self.tl = tl
        groups = rank_groups(tl)  # from GROUP_FROM ranks on, ranks that agree share a row
        self.lanes = groups if len(groups) < len(tl.ranks) else []
        self.rank, self.op = dropdown("rank", tl.ranks), dropdown("op", [s.op for s in tl.ops])
        self.group = dropdown("group", tl.groups)
        self.order = w.Dropdown(options=["time", "wait"], value="wait", description="sort by")
        self.listing = w.Select(options=[], rows=10, layout=w.Layout(width="100%"))
        self.drawing, self.detail, self.count = w.HTML(), w.HTML(), w.Label()
        self.shown: list[Collective] = []
        for dd in (self.rank, self.op, self.group, self.order):
            dd.observe(self.relist, names="value")
        self.listing.observe(self.redraw, names="index")
        self.relist()
        self.box = w.VBox(
            [
                w.HTML(render_heading_html(tl)),
                w.HBox([self.rank, self.op, self.group, self.order]),
                self.drawing,
                self.count,
                self.listing,
                self.detail,
                w.HTML(render_tables_html(tl)),
            ]
        )

    def relist(self, _: object = None) -> None:
        rank, op, group = _chosen(self.rank), _chosen(self.op), _chosen(self.group)
        found = select_collectives(
            self.tl, None if rank is None else int(rank), op, group, self.order.value
        )
        self.shown[:] = found[:MAX_LISTED]
        more = f" (first {MAX_LISTED} of {len(found)})" if len(found) > MAX_LISTED else ""
        self.listing.description = ""
        self.listing.options = [(collective_label(c), i) for i, c in enumerate(self.shown)]
        self.count.value = f"{len(found)} collectives{more}"
        self.redraw()

    def redraw(self, _: object = None) -> None:
        rank, op, idx = _chosen(self.rank), _chosen(self.op), self.listing.index
        sel = self.shown[idx] if idx is not None and idx < len(self.shown) else None
        self.drawing.value = render_svg(
            self.tl,
            ranks=None if rank is None else [int(rank)],
            ops=None if op is None else [op],
            selected=None if sel is None else (sel.group, sel.seq),
        )
        self.detail.value = "" if sel is None else detail_html(sel, self.lanes)


def detail_html(c: Collective, lanes: Sequence[tuple[int, ...]] = ()) -> str:
    """The picked collective: its label over one row per rank (or per lane of ranks that
    agree) with the call site."""
    return f"<b>{esc(collective_label(c))}</b>" + html_table(SLOT_HEADER, slot_rows(c, lanes))
