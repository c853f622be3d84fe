"""`ProfileView`: every rank's profiled steps, split by phase, and the straggler with its cause;
as text, static HTML, a widget (the HTML), and one Chrome trace of all ranks."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from distnb.judgement.slowness import PRECEDENCE, Breakdown, Phase, breakdown
from distnb.records.collective import CollectiveEvent
from distnb.records.profiling import RankProfile
from distnb.views._format import (
    DIFF_ROW_BG,
    HEADING_STYLE,
    Row,
    format_ns,
    html_block,
    html_table,
    text_table,
)
from distnb.views.profiling_chrome import write_profile_trace

__all__ = ["ProfileView"]

PHASES = (Phase.COMPUTE, Phase.COLLECTIVE, Phase.WAIT, Phase.DATA, Phase.OPTIMIZER, Phase.OTHER)
assert set(PHASES) == {*PRECEDENCE, Phase.OTHER}
OVERLAP = "comm/compute overlap"  # the share of its collectives' time its ops ran beside them


class ProfileView:
    """Where each rank's time went, per step, and who is slow and why.

    Example::

        view = s.run(cell, profile=True).views[0]     # %%allranks --profile
        view.result.straggler                         # Straggler(rank=1, phase=DATA, ...)
        view.export_chrome_trace("profile.json")      # open in https://ui.perfetto.dev
    """

    def __init__(
        self,
        profiles: Sequence[RankProfile],
        events: Sequence[CollectiveEvent] = (),
        offsets: Mapping[int, int] | None = None,
        precision_ns: int = 0,
    ) -> None:
        self.profiles = tuple(sorted(profiles, key=lambda p: p.rank))
        self.events = tuple(events)
        self.offsets = dict(offsets or {})
        self.result: Breakdown = breakdown(self.profiles, self.events, self.offsets, precision_ns)

    def _heading(self) -> str:
        counts = sorted({len(r.steps) for r in self.result.ranks})
        each = "-".join(map(str, (counts[0], counts[-1]) if len(counts) > 1 else counts))
        return (
            f"profile of {len(self.profiles)} ranks, {each} {self.result.steps_by} each; "
            f"median time per {self.result.unit}"
        )

    def _rows(self) -> list[list[str]]:
        rows = []
        for r in self.result.ranks:
            cells = [str(r.rank), format_ns(r.step_ns)]
            overlap = "-" if r.overlap is None else f"{r.overlap:.0%}"
            rows.append(cells + [format_ns(r.per_step(p)) for p in PHASES] + [overlap])
        return rows

    def _notes(self) -> list[str]:
        notes = []
        dropped = sum(p.dropped for p in self.profiles)
        if dropped:
            notes.append(f"{dropped} of the oldest spans were left out (the ranks' bound)")
        cost = max((p.cost_ns for p in self.profiles), default=0)
        notes.append(
            f"starting and reading the profiler cost each rank up to {format_ns(cost)}, "
            "outside the steps above (the first profile of a process starts kineto: seconds)"
        )
        return notes

    def _header(self) -> list[str]:
        return ["rank", self.result.unit, *(p.value for p in PHASES), OVERLAP]

    def __repr__(self) -> str:
        header = self._header()
        lines = [self._heading(), text_table(header, self._rows()), self.result.verdict]
        return "\n".join(lines + self._notes())

    def _repr_html_(self) -> str:
        slow = self.result.straggler.rank if self.result.straggler else None
        rows = [
            Row(r, DIFF_ROW_BG, "straggler") if r[0] == str(slow) else Row(r) for r in self._rows()
        ]
        header = self._header()
        return (
            f"<div>{html_block(self._heading(), HEADING_STYLE, bold=True)}"
            f"{html_table(header, rows)}"
            f"{html_block([self.result.verdict, *self._notes()], HEADING_STYLE)}</div>"
        )

    def widget(self) -> Any:
        """An `ipywidgets.HTML` of the view."""
        import ipywidgets

        return ipywidgets.HTML(self._repr_html_())

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> None:
        """Write one Chrome trace of every rank: steps, distnb's collectives, the profiler's
        spans per thread, on one clock."""
        write_profile_trace(path, self.profiles, self.events, self.result, self.offsets)
