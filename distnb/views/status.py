"""The session's status table and start-up progress."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from distnb.records.cell import RankInfo
from distnb.views._format import esc, html_table, text_table
from distnb.views.display import in_kernel

COLUMNS = ("rank", "host", "pid", "device", "backend")


@dataclass(frozen=True, slots=True)
class Status:
    """What `session.status()` returns: one row per rank, or a note that nothing runs."""

    ranks: tuple[RankInfo, ...]
    note: str = ""

    def rows(self) -> list[tuple[str, ...]]:
        return [(str(r.rank), r.host, str(r.pid), r.device, r.backend) for r in self.ranks]

    def __repr__(self) -> str:
        if not self.ranks:
            return self.note or "distnb: no ranks"
        return "\n".join([text_table(COLUMNS, self.rows()), *([self.note] if self.note else [])])

    def _repr_html_(self) -> str:
        if not self.ranks:
            return f"<p>{esc(self.note or 'distnb: no ranks')}</p>"
        note = f"<p>{esc(self.note)}</p>" if self.note else ""
        return html_table(COLUMNS, self.rows()) + note


class Progress:
    """A one-line progress bar: updated in place in a kernel, printed per phase elsewhere."""

    def __init__(self, total: int, enabled: bool = True) -> None:
        self.total = total
        self.enabled = enabled
        self._handle: Any = None
        self._last = ""
        if enabled and in_kernel():
            from IPython.display import display

            self._handle = display({"text/plain": ""}, raw=True, display_id=True)  # type: ignore[no-untyped-call]

    def show(self, phase: str, done: int) -> None:
        if not self.enabled:
            return
        width = 20
        filled = width * done // max(self.total, 1)
        line = f"distnb: [{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} {phase}"
        if line == self._last:
            return
        self._last = line
        if self._handle is not None:
            self._handle.update({"text/plain": line}, raw=True)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.update({"text/plain": ""}, raw=True)
        elif self.enabled and self._last:
            print(self._last, file=sys.stderr)


def status_of(ranks: Sequence[RankInfo], note: str = "") -> Status:
    return Status(tuple(ranks), note)
