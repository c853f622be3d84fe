"""Show overflow reports: the cross-rank summary on top, then each rank's frames.

`OverflowView(reports)` takes plain `RankOverflowReport` records (no live session). Displaying it
gives static HTML (it survives nbconvert and GitHub); `repr()` gives aligned text for terminals;
`view.widget()` builds an ipywidgets Tab with one tab per rank. In each rank's table the first
non-finite frame is highlighted red and frames that warned about fp16/bf16 headroom amber.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from distnb.records.overflow import CrossRankSummary, Frame, RankOverflowReport, summarize
from distnb.views._format import (
    DIFF_ROW_BG,
    WARN_ROW_BG,
    Row,
    esc,
    html_block,
    html_table,
    text_table,
)

__all__ = ["OverflowView", "frame_rows", "render_html", "render_text"]

HEADER = (
    "step",
    "phase",
    "module",
    "tensor",
    "dtype",
    "|x| min",
    "|x| max",
    "min≠0",
    "headroom",
    "NaN",
    "Inf",
    "zeros",
    "<tiny",
)
BAD, LOW, OK = "nonfinite", "headroom", ""


class OverflowView:
    """Per-rank overflow frames under a cross-rank summary.

    Example::

        view = OverflowView([report0, report1])
        view            # HTML in a notebook, text in a terminal
        view.widget()   # a Tab per rank
    """

    def __init__(self, reports: Sequence[RankOverflowReport]) -> None:
        self.reports = tuple(sorted(reports, key=lambda r: r.rank))
        self.summary: CrossRankSummary = summarize(self.reports)

    def __repr__(self) -> str:
        return render_text(self.reports, self.summary)

    def _repr_html_(self) -> str:
        return render_html(self.reports, self.summary)

    def widget(self) -> Any:
        """An `ipywidgets.VBox`: the summary, then a Tab with one rank per tab."""
        import ipywidgets as w  # views are the only place ipywidgets is imported, lazily

        tabs = w.Tab(children=[w.HTML(_rank_html(r)) for r in self.reports])
        for i, r in enumerate(self.reports):
            mark = " ⚠" if r.first is not None else ""
            tabs.set_title(i, f"rank {r.rank}{mark}")
        if self.summary.first_rank is not None:
            tabs.selected_index = self.summary.ranks.index(self.summary.first_rank)
        return w.VBox([w.HTML(_summary_html(self.summary)), tabs])


# -- cells -------------------------------------------------------------------------------------


def _num(x: float | None) -> str:
    if x is None:
        return "—"
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.3g}"


def _count(n: int | None) -> str:
    return "—" if n is None else str(n)


def frame_cells(f: Frame) -> list[str]:
    step = f"{f.step}.{f.micro}" if f.micro else str(f.step)
    dtype = f.dtype if f.dtype == f.compute_dtype else f"{f.dtype}→{f.compute_dtype}"
    headroom = "—" if f.headroom_bits is None else f"{f.headroom_bits:.1f} bits"
    return [
        step,
        f.phase.value,
        f"{f.module or '<root>'} ({f.cls})",
        f.name,
        dtype,
        _num(f.abs_min),
        _num(f.abs_max),
        _num(f.min_nonzero),
        headroom,
        _count(f.nan),
        _count(f.inf),
        _count(f.zeros),
        _count(f.under),
    ]


def frame_rows(report: RankOverflowReport, frames: Sequence[Frame]) -> list[tuple[str, Frame]]:
    """Each frame with its mark: `nonfinite` (the first non-finite frame), `headroom`, or ''."""
    warned = {(f.step, f.micro, f.order) for f in report.headroom}
    first = report.first.point if report.first else None
    rows = []
    for f in frames:
        mark = BAD if f.point == first else (LOW if f.point in warned else OK)
        rows.append((mark, f))
    return rows


def _status(report: RankOverflowReport) -> str:
    steps = f"{report.steps} step" + ("" if report.steps == 1 else "s")
    head = f"rank {report.rank}: {steps}, {report.readbacks} readbacks"
    head += f", {report.stats} statistics"
    if report.first is not None:
        f = report.first
        head += f"; first non-finite at step {f.step}, {f.where}: {f.describe()}"
    else:
        head += "; all values finite"
    if report.stopped:
        head += f"; stopped ({report.stopped})"
    return head


def _ring_title(report: RankOverflowReport) -> str:
    if report.first is not None:
        return f"The last {len(report.ring)} frames up to the first non-finite value"
    return f"The latest {len(report.ring)} frames"


# -- text --------------------------------------------------------------------------------------


def render_text(reports: Sequence[RankOverflowReport], summary: CrossRankSummary) -> str:
    out = summary.lines()
    for r in reports:
        out += ["", _status(r)]
        if r.ring:
            out.append(_ring_title(r) + ":")
            rows = [
                ["!!" if m == BAD else ("~" if m == LOW else ""), *frame_cells(f)]
                for m, f in frame_rows(r, r.ring)
            ]
            out.append(text_table(["", *HEADER], rows, indent="  "))
        if r.headroom:
            out.append(f"Low headroom ({len(r.headroom)} warnings), first at {r.headroom[0].where}")
        if r.traced:
            out.append(
                f"{len(r.traced)} traced frames (steps {_steps(r.traced)}): see the HTML view"
            )
    return "\n".join(out)


def _steps(frames: Sequence[Frame]) -> str:
    return ", ".join(str(s) for s in sorted({f.step for f in frames}))


# -- HTML --------------------------------------------------------------------------------------


SUMMARY_STYLE = "font-family:monospace;font-size:12px;margin:4px 0"
STATUS_STYLE = "font-family:monospace;font-size:12px"
MARK_BG = {BAD: DIFF_ROW_BG, LOW: WARN_ROW_BG}


def _table_html(report: RankOverflowReport, frames: Sequence[Frame]) -> str:
    rows = [
        Row(frame_cells(f), background=MARK_BG.get(mark, ""), mark=mark)
        for mark, f in frame_rows(report, frames)
    ]
    return html_table(HEADER, rows)


def _details(label: str, body: str) -> str:
    return f"<details><summary>{esc(label)}</summary>{body}</details>"


def _summary_html(summary: CrossRankSummary) -> str:
    return html_block(summary.lines(), SUMMARY_STYLE, bold=True)


def _rank_html(r: RankOverflowReport) -> str:
    parts = [html_block(_status(r), STATUS_STYLE)]
    if r.ring:
        parts.append(html_block(_ring_title(r), "") + _table_html(r, r.ring))
    if r.headroom:
        label = f"Low fp16/bf16 headroom: {len(r.headroom)} warnings"
        parts.append(_details(label, _table_html(r, r.headroom)))
    if r.traced:
        label = f"Traced steps {_steps(r.traced)}: {len(r.traced)} frames"
        parts.append(_details(label, _table_html(r, r.traced)))
    return "".join(parts)


def render_html(reports: Sequence[RankOverflowReport], summary: CrossRankSummary) -> str:
    sections = [_summary_html(summary)]
    for r in reports:
        sections.append(f'<div style="margin-top:8px">{_rank_html(r)}</div>')
    return "<div>" + "".join(sections) + "</div>"
