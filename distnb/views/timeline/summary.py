"""The timeline's numbers as tables: the headline, stragglers, per-op totals, longest waits.

Each table is built once as rows of strings, then rendered as aligned text (`render_text`) or
as HTML (`render_heading_html`, `render_tables_html`) through `views/_format.py`.
"""

from __future__ import annotations

import heapq

from distnb.ranklist import format_ranks
from distnb.views._format import (
    HEADING_STYLE,
    format_bytes,
    format_ns,
    html_block,
    html_table,
    text_table,
)
from distnb.views.timeline.layout import rank_groups, ranks_label
from distnb.views.timeline.model import Collective, Timeline

__all__ = ["render_heading_html", "render_tables_html", "render_text"]

STRAGGLER_LIMIT = 8  # rows of the straggler table before the rest are summed
STRAGGLER_HEADER = [
    "rank",
    "arrived last",
    "others' wait caused",
    "own wait",
    "stopped in a debugger",
]
OP_HEADER = ["op", "count", "bytes", "total time", "algbw GB/s", "busbw GB/s", "total wait"]
WAIT_HEADER = ["collective", "last rank", "held others", "call site of the last rank"]
LANE_HEADER = ["lane", "ranks", "arrived last", "others' wait caused", "own wait"]
LANES = "Lanes (ranks whose collectives agree share one; a late rank has its own)"
STRAGGLERS = "Stragglers (arrived last; the others' wait for it)"
NOTE_STYLE = "font-family:sans-serif;font-size:13px;margin:8px 0;color:#b3261e"


def headline(tl: Timeline) -> str:
    return (
        f"Collective timeline: {len(tl.collectives)} collectives ({tl.n_events} events) "
        f"on {format_ranks(tl.ranks, none='no ranks')}, groups {', '.join(tl.groups) or '-'}; "
        f"span {format_ns(tl.t1_ns - tl.t0_ns)}"
    )


def straggler_rows(tl: Timeline, limit: int = STRAGGLER_LIMIT) -> list[list[str]]:
    """The ranks that held the others up most; on a big job the rest are summed in one line."""
    rows = [
        [
            tl.who(s.rank).removeprefix("rank "),
            str(s.times_last),
            format_ns(s.wait_caused_ns),
            format_ns(s.own_wait_ns),
            format_ns(s.stopped_ns) if s.stopped_ns else "-",
        ]
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
                format_ns(sum(s.stopped_ns for s in rest)),
            ]
        )
    return rows


def lane_rows(tl: Timeline) -> list[list[str]]:
    """From `GROUP_FROM` ranks on, the drawing's lanes as rows: which ranks share one, and
    what they did to the others' waiting; none below (a lane is a rank, as in the stragglers
    table)."""
    groups = rank_groups(tl)
    if len(groups) == len(tl.ranks):
        return []
    stats = {s.rank: s for s in tl.stragglers}
    return [
        [
            ranks_label(tl, ranks),
            str(len(ranks)),
            str(sum(stats[r].times_last for r in ranks)),
            format_ns(sum(stats[r].wait_caused_ns for r in ranks)),
            format_ns(sum(stats[r].own_wait_ns for r in ranks)),
        ]
        for ranks in groups
    ]


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
        [f"{c.group} #{c.seq} {c.op}", tl.who(c.last_rank), format_ns(c.total_wait_ns), _site(c)]
        for c in longest_waits(tl)
    ]


def _site(c: Collective) -> str:
    site = c.site
    text = f"{site}: {site.code.strip()}" if site.code else str(site)
    origin = next((s.origin for s in c.slots if s.rank == c.last_rank), "")
    return f"{text} [{origin}]" if origin else text


def stopped_note(tl: Timeline) -> str:
    """Time ranks sat stopped in a debugger: said once, as not waiting."""
    if not tl.stops:
        return ""
    held = sum(c.stopped_wait_ns for c in tl.collectives)
    others = f"; the others' wait meanwhile, {format_ns(held)}," if held else ""
    ranks = format_ranks({s.rank for s in tl.stops})
    return (
        f"Stopped in a debugger: {ranks}, {format_ns(tl.stopped_ns)}{others} "
        "is not counted as waiting or as wait caused"
    )


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
    lines = [headline(tl), tl.clock_note, *[n for n in [stopped_note(tl)] if n], ""]
    if not tl.collectives:
        return "\n".join([*lines, "(no collectives recorded)"])
    lanes = lane_rows(tl)
    if lanes:
        lines += [f"{LANES}:", text_table(LANE_HEADER, lanes, indent="  "), ""]
    lines += [f"{STRAGGLERS}:", text_table(STRAGGLER_HEADER, straggler_rows(tl), indent="  ")]
    lines += ["", "Per op:", text_table(OP_HEADER, op_rows(tl), indent="  ")]
    waits = wait_rows(tl)
    if waits:
        lines += ["", "Longest waits:", text_table(WAIT_HEADER, waits, indent="  ")]
    note = incomplete_note(tl)
    return "\n".join([*lines, *(["", note] if note else [])])


def render_heading_html(tl: Timeline) -> str:
    note = stopped_note(tl)
    return html_block(
        [headline(tl), tl.clock_note, *([note] if note else [])], HEADING_STYLE, bold=True
    )


def render_tables_html(tl: Timeline) -> str:
    lanes = lane_rows(tl)
    parts = [html_block(LANES, HEADING_STYLE), html_table(LANE_HEADER, lanes)] if lanes else []
    parts += [
        html_block(STRAGGLERS, HEADING_STYLE),
        html_table(STRAGGLER_HEADER, straggler_rows(tl)),
        html_block("Per op", HEADING_STYLE),
        html_table(OP_HEADER, op_rows(tl)),
    ]
    waits = wait_rows(tl)
    if waits:
        parts += [html_block("Longest waits", HEADING_STYLE), html_table(WAIT_HEADER, waits)]
    note = incomplete_note(tl)
    if note:
        parts.append(html_block(note, NOTE_STYLE))
    return "<div>" + "".join(parts) + "</div>"
