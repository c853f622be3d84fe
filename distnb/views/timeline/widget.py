"""The interactive timeline: selectors, the SVG drawing, a collective list and its call sites.

Selection goes through widgets rather than matplotlib pick events, which need an interactive
backend; this works in JupyterLab and classic Notebook with the default inline backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from distnb.views._format import esc, format_bytes, format_ns, html_table
from distnb.views.timeline.model import Collective, Timeline
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


def slot_rows(c: Collective) -> list[list[str]]:
    """One row per rank: when it arrived (after the first), its wait and its call site."""
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
        self.detail.value = "" if sel is None else detail_html(sel)


def detail_html(c: Collective) -> str:
    """The picked collective: its label over one row per rank with the rank's call site."""
    return f"<b>{esc(collective_label(c))}</b>" + html_table(SLOT_HEADER, slot_rows(c))
