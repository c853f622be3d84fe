"""A collective mismatch as a table: one row per rank with its call and call site."""

from __future__ import annotations

from distnb.matching import describe
from distnb.records.collective import Mismatch
from distnb.views._format import DIFF_ROW_BG, Cell, Row, esc, html_table, text_table

HEADER = ("rank", "call", "call site")


class MismatchView:
    """Rows of ranks at fault (`mismatch.ranks`) are highlighted."""

    def __init__(self, mismatch: Mismatch) -> None:
        self.mismatch = mismatch

    def rows(self) -> list[tuple[int, str, str]]:
        return [(fp.rank, describe(fp), str(fp.site)) for fp in self.mismatch.fingerprints]

    def heading(self) -> str:
        m = self.mismatch
        return f"{m.kind.value} mismatch in {m.op} #{m.seq} on {m.group}"

    def __repr__(self) -> str:
        rows = [(str(rank), call, site) for rank, call, site in self.rows()]
        lines = [self.heading(), text_table(HEADER, rows, indent="  ")]
        if self.mismatch.hint:
            lines.append(self.mismatch.hint)
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        odd = set(self.mismatch.ranks)
        rows = [
            Row(
                [str(rank), Cell(f"<code>{esc(call)}</code>"), site],
                background=DIFF_ROW_BG if rank in odd else "",
            )
            for rank, call, site in self.rows()
        ]
        hint = f"<p>{esc(self.mismatch.hint)}</p>" if self.mismatch.hint else ""
        return (
            f"<p><b>CollectiveMismatchError</b>: {esc(self.heading())}. "
            "Nothing was sent; the process group still works.</p>"
            f"{html_table(HEADER, rows)}{hint}"
        )
