"""The interactive timeline: selectors, the SVG drawing, a collective list and its call sites.

Selection goes through widgets rather than matplotlib pick events, which need an interactive
backend; this works in JupyterLab and classic Notebook with the default inline backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from distnb.views._format import esc, format_bytes, format_ns
from distnb.views.timeline import MAX_LISTED, html_table, render_heading_html, render_tables_html
from distnb.views.timeline_model import Collective, Timeline
from distnb.views.timeline_svg import render_svg

__all__ = ["build_widget", "collective_label", "select_collectives", "slot_rows"]

ALL = "all"
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
    import ipywidgets as w  # views are the only place ipywidgets is imported, lazily

    def dropdown(label: str, values: Sequence[object]) -> Any:
        return w.Dropdown(options=[ALL, *map(str, values)], value=ALL, description=label)

    rank_dd, op_dd = dropdown("rank", tl.ranks), dropdown("op", [s.op for s in tl.ops])
    group_dd = dropdown("group", tl.groups)
    order_dd = w.Dropdown(options=["time", "wait"], value="wait", description="sort by")
    listing = w.Select(options=[], rows=10, layout=w.Layout(width="100%"))
    drawing = w.HTML()
    detail = w.HTML()
    shown: list[Collective] = []

    def chosen(dd: Any) -> str | None:
        return None if dd.value == ALL else str(dd.value)

    def redraw(_: object = None) -> None:
        rank = chosen(rank_dd)
        op = chosen(op_dd)
        idx = listing.index
        sel = shown[idx] if idx is not None and idx < len(shown) else None
        drawing.value = render_svg(
            tl,
            ranks=None if rank is None else [int(rank)],
            ops=None if op is None else [op],
            selected=None if sel is None else (sel.group, sel.seq),
        )
        detail.value = (
            ""
            if sel is None
            else f"<b>{esc(collective_label(sel))}</b>" + html_table(SLOT_HEADER, slot_rows(sel))
        )

    def relist(_: object = None) -> None:
        rank = chosen(rank_dd)
        found = select_collectives(
            tl, None if rank is None else int(rank), chosen(op_dd), chosen(group_dd), order_dd.value
        )
        shown[:] = found[:MAX_LISTED]
        more = f" (first {MAX_LISTED} of {len(found)})" if len(found) > MAX_LISTED else ""
        listing.description = ""
        listing.options = [(collective_label(c), i) for i, c in enumerate(shown)]
        count.value = f"{len(found)} collectives{more}"
        redraw()

    count = w.Label()
    for dd in (rank_dd, op_dd, group_dd, order_dd):
        dd.observe(relist, names="value")
    listing.observe(redraw, names="index")
    relist()
    return w.VBox(
        [
            w.HTML(render_heading_html(tl)),
            w.HBox([rank_dd, op_dd, group_dd, order_dd]),
            drawing,
            count,
            listing,
            detail,
            w.HTML(render_tables_html(tl)),
        ]
    )
