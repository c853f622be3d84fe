"""Show collective timelines: text summary, static HTML (SVG), widget, PNG and Chrome trace.

`TimelineView` takes plain `CollectiveEvent` records, so a saved report renders again without a
session. Displaying it gives static HTML: an inline SVG whose bars show their call site on hover,
the straggler summary and the per-op table. `view.widget()` adds rank/op/group selectors and a
list of collectives; picking one outlines it in the drawing and lists each rank's call site. (A
matplotlib pick handler would need an interactive backend; the widget works with any.)
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from distnb.records.collective import CollectiveEvent
from distnb.views._format import (
    CELL_STYLE,
    HEAD_STYLE,
    TABLE_STYLE,
    esc,
    format_bytes,
    format_ns,
    text_table,
)
from distnb.views.timeline_model import ClockSync, Collective, Timeline, build_timeline
from distnb.views.timeline_svg import render_svg
from distnb.views.timeline_trace import write_chrome_trace

__all__ = ["TimelineView"]

STRAGGLER_LIMIT = 8  # rows of the straggler table before the rest are summed
MAX_LISTED = 500  # collectives in the widget's list: a Select with 10,000 options is sluggish


class TimelineView:
    """A timeline of collectives across ranks.

    Example::

        view = TimelineView(events, offsets=ClockOffsets({0: 0, 1: -41_000}, precision_ns=20_000))
        view                                  # SVG + straggler summary + per-op table
        view.widget()                         # selectors and per-collective call sites
        view.savefig("timeline.png")
        view.export_chrome_trace("trace.json")  # open in https://ui.perfetto.dev
    """

    def __init__(
        self,
        events: Sequence[CollectiveEvent],
        offsets: ClockSync | Mapping[int, int] | None = None,
    ) -> None:
        self.events = tuple(events)
        self.timeline = build_timeline(self.events, offsets)

    def __repr__(self) -> str:
        return render_text(self.timeline)

    def _repr_html_(self) -> str:
        tl = self.timeline
        return f"<div>{render_heading_html(tl)}{render_svg(tl)}{render_tables_html(tl)}</div>"

    def figure(
        self, *, ranks: Collection[int] | None = None, ops: Collection[str] | None = None
    ) -> Any:
        """A matplotlib `Figure` of the timeline."""
        from distnb.views.timeline_mpl import figure

        return figure(self.timeline, ranks=ranks, ops=ops)

    def savefig(self, path: str | os.PathLike[str], *, dpi: int = 100) -> None:
        """Write the matplotlib drawing as PNG (or any format matplotlib infers from `path`)."""
        self.figure().savefig(path, dpi=dpi)

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> None:
        """Write Chrome trace-event JSON: one process per rank, one thread per group."""
        write_chrome_trace(self.timeline, path)

    def widget(self) -> Any:
        """An `ipywidgets.VBox` with selectors, the drawing, a collective list and call sites."""
        from distnb.views.timeline_widget import build_widget

        return build_widget(self.timeline)


# -- text ----------------------------------------------------------------------------------


def headline(tl: Timeline) -> str:
    ranks = ", ".join(map(str, tl.ranks)) if len(tl.ranks) <= 8 else f"{len(tl.ranks)} ranks"
    return (
        f"Collective timeline: {len(tl.collectives)} collectives ({tl.n_events} events) "
        f"on ranks {ranks}, groups {', '.join(tl.groups) or '-'}; "
        f"span {format_ns(tl.t1_ns - tl.t0_ns)}"
    )


def straggler_rows(tl: Timeline, limit: int = STRAGGLER_LIMIT) -> list[list[str]]:
    """The ranks that held the others up most; on a big job the rest are summed in one line."""
    rows = [
        [str(s.rank), str(s.times_last), format_ns(s.wait_caused_ns), format_ns(s.own_wait_ns)]
        for s in tl.stragglers[:limit]
    ]
    rest = tl.stragglers[limit:]
    if rest:
        rows.append(
            [
                f"{len(rest)} more",
                str(sum(s.times_last for s in rest)),
                format_ns(sum(s.wait_caused_ns for s in rest)),
                format_ns(sum(s.own_wait_ns for s in rest)),
            ]
        )
    return rows


STRAGGLER_HEADER = ["rank", "arrived last", "others' wait caused", "own wait"]
OP_HEADER = ["op", "count", "bytes", "total time", "algbw GB/s", "busbw GB/s", "total wait"]
WAIT_HEADER = ["collective", "last rank", "held others", "call site of the last rank"]


def op_rows(tl: Timeline) -> list[list[str]]:
    def bw(x: float | None) -> str:
        return "-" if x is None else f"{x:.3g}"

    return [
        [
            s.op,
            str(s.count),
            format_bytes(s.nbytes),
            format_ns(s.time_ns),
            bw(s.algbw_gbps),
            bw(s.busbw_gbps),
            format_ns(s.wait_ns),
        ]
        for s in tl.ops
    ]


def longest_waits(tl: Timeline, n: int = 5) -> list[Collective]:
    top = heapq.nlargest(n, tl.collectives, key=lambda c: c.total_wait_ns)
    return [c for c in top if c.total_wait_ns > 0]


def wait_rows(tl: Timeline) -> list[list[str]]:
    return [
        [f"{c.group} #{c.seq} {c.op}", f"rank {c.last_rank}", format_ns(c.total_wait_ns), _site(c)]
        for c in longest_waits(tl)
    ]


def _site(c: Collective) -> str:
    site = c.site
    return f"{site}: {site.code.strip()}" if site.code else str(site)


def incomplete_note(tl: Timeline) -> str:
    bad = [c for c in tl.collectives if not c.complete]
    if not bad:
        return ""
    c = bad[0]
    return (
        f"{len(bad)} collectives were not reported by every rank of their group "
        f"(first: {c.group} #{c.seq} {c.op}, {len(c.slots)} of {c.group_size} ranks)"
    )


def render_text(tl: Timeline) -> str:
    lines = [headline(tl), tl.clock_note, ""]
    if not tl.collectives:
        return "\n".join([*lines, "(no collectives recorded)"])
    lines += ["Stragglers (arrived last; the others' wait for it):"]
    lines += [text_table(STRAGGLER_HEADER, straggler_rows(tl), indent="  "), "", "Per op:"]
    lines += [text_table(OP_HEADER, op_rows(tl), indent="  ")]
    waits = wait_rows(tl)
    if waits:
        lines += ["", "Longest waits:", text_table(WAIT_HEADER, waits, indent="  ")]
    note = incomplete_note(tl)
    return "\n".join([*lines, *(["", note] if note else [])])


# -- HTML ----------------------------------------------------------------------------------


def html_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f'<th style="{HEAD_STYLE}">{esc(h)}</th>' for h in header)
    body = "".join(
        "<tr>" + "".join(f'<td style="{CELL_STYLE}">{esc(c)}</td>' for c in row) + "</tr>"
        for row in rows
    )
    return (
        f'<table style="{TABLE_STYLE}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
    )


HEADING = 'style="font-family:sans-serif;font-size:13px;margin:8px 0 2px"'


def render_heading_html(tl: Timeline) -> str:
    return f"<div {HEADING}><b>{esc(headline(tl))}</b><br>{esc(tl.clock_note)}</div>"


def render_tables_html(tl: Timeline) -> str:
    h = HEADING
    parts = [
        f"<div {h}>Stragglers (arrived last; the others' wait for it)</div>",
        html_table(STRAGGLER_HEADER, straggler_rows(tl)),
        f"<div {h}>Per op</div>",
        html_table(OP_HEADER, op_rows(tl)),
    ]
    waits = wait_rows(tl)
    if waits:
        parts += [f"<div {h}>Longest waits</div>", html_table(WAIT_HEADER, waits)]
    note = incomplete_note(tl)
    if note:
        style = "font-family:sans-serif;font-size:13px;margin:8px 0;color:#b3261e"
        parts.append(f'<div style="{style}">{esc(note)}</div>')
    return "<div>" + "".join(parts) + "</div>"
