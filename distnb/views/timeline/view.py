"""`TimelineView`: one timeline of collectives, shown as text, static HTML (SVG and tables), a
widget, a matplotlib figure or a Chrome trace, each by the renderer that makes it.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from distnb.records.collective import CollectiveEvent
from distnb.records.debug import DebugStop
from distnb.views.timeline.chrome import write_chrome_trace
from distnb.views.timeline.model import ClockSync, build_timeline
from distnb.views.timeline.mpl import figure
from distnb.views.timeline.summary import render_heading_html, render_tables_html, render_text
from distnb.views.timeline.svg import render_svg
from distnb.views.timeline.widget import build_widget

__all__ = ["TimelineView"]


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
        hosts: Mapping[int, str] | None = None,
        stops: Sequence[DebugStop] = (),
    ) -> None:
        self.events = tuple(events)
        self.stops = tuple(stops)  # time ranks sat in a debugger: not waiting
        self.timeline = build_timeline(self.events, offsets, hosts, self.stops)

    def __repr__(self) -> str:
        return render_text(self.timeline)

    def _repr_html_(self) -> str:
        tl = self.timeline
        return f"<div>{render_heading_html(tl)}{render_svg(tl)}{render_tables_html(tl)}</div>"

    def figure(
        self, *, ranks: Collection[int] | None = None, ops: Collection[str] | None = None
    ) -> Any:
        """A matplotlib `Figure` of the timeline."""
        return figure(self.timeline, ranks=ranks, ops=ops)

    def savefig(self, path: str | os.PathLike[str], *, dpi: int = 100) -> None:
        """Write the matplotlib drawing as PNG (or any format matplotlib infers from `path`)."""
        self.figure().savefig(path, dpi=dpi)

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> None:
        """Write Chrome trace-event JSON: one process per rank, one thread per group."""
        write_chrome_trace(self.timeline, path)

    def widget(self) -> Any:
        """An `ipywidgets.VBox` with selectors, the drawing, a collective list and call sites."""
        return build_widget(self.timeline)
