"""A collective mismatch as a table: one row per rank with its call and call site.

From `GROUP_FROM` ranks on, ranks that made the same call at the same place share a row
(`0-15,17-31`), so the rank at fault is the row that stands apart, not one row among 32.
"""

from __future__ import annotations

from distnb.judgement import describe
from distnb.judgement.mismatch import aftermath
from distnb.records.collective import Mismatch
from distnb.views._format import DIFF_ROW_BG, Cell, Row, esc, html_table, text_table
from distnb.views.grouping import GROUP_FROM, group_rows

HEADER = ("rank", "call", "call site")


class MismatchView:
    """Rows of ranks at fault (`mismatch.ranks`) are highlighted."""

    def __init__(self, mismatch: Mismatch) -> None:
        self.mismatch = mismatch

    def rows(self) -> list[tuple[int, str, str]]:
        return [(fp.rank, describe(fp), str(fp.site)) for fp in self.mismatch.fingerprints]

    def shown(self) -> list[tuple[tuple[str, ...], bool]]:
        """The rows as shown (rank or ranks, call, call site), each with whether it holds a
        rank at fault."""
        rows, at_fault = self.rows(), self.mismatch.ranks
        text = [(str(rank), call, site) for rank, call, site in rows]
        if len(rows) < GROUP_FROM:
            return [(row, rank in at_fault) for row, (rank, _, _) in zip(text, rows, strict=True)]
        odd = {(call, site) for rank, call, site in rows if rank in at_fault}
        merged = group_rows(text, [rank for rank, _, _ in rows], apart=())
        return [(row, row[1:] in odd) for row in merged]

    def heading(self) -> str:
        m = self.mismatch
        return f"{m.kind.value} mismatch in {m.op} #{m.seq} on {m.group}"

    def __repr__(self) -> str:
        lines = [self.heading(), text_table(HEADER, [row for row, _ in self.shown()], indent="  ")]
        if self.mismatch.hint:
            lines.append(self.mismatch.hint)
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = [
            Row([rank, Cell(f"<code>{esc(call)}</code>"), site], DIFF_ROW_BG if odd else "")
            for (rank, call, site), odd in self.shown()
        ]
        m = self.mismatch
        hint = f"<p>{esc(m.hint)}</p>" if m.hint else ""
        return (
            f"<p><b>CollectiveMismatchError</b>: {esc(self.heading())}. "
            f"{esc(aftermath(m.op.split('/')[0], m.held))}</p>"
            f"{html_table(HEADER, rows)}{hint}"
        )
