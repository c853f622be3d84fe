"""A collective mismatch as a table: one row per rank with its call and call site."""

from __future__ import annotations

import html

from distnb.matching import describe
from distnb.records.collective import Mismatch


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
        rows = [("rank", "call", "call site"), *((str(r), c, s) for r, c, s in self.rows())]
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        lines = [self.heading()]
        lines += [
            "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows
        ]
        if self.mismatch.hint:
            lines.append(self.mismatch.hint)
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        odd = set(self.mismatch.ranks)
        body = "".join(
            f'<tr style="background:{"#fde2e1" if rank in odd else "transparent"}">'
            f"<td>{rank}</td><td><code>{html.escape(call)}</code></td>"
            f"<td>{html.escape(site)}</td></tr>"
            for rank, call, site in self.rows()
        )
        hint = f"<p>{html.escape(self.mismatch.hint)}</p>" if self.mismatch.hint else ""
        return (
            f"<p><b>CollectiveMismatchError</b>: {html.escape(self.heading())}. "
            "Nothing was sent; the process group still works.</p>"
            "<table><thead><tr><th>rank</th><th>call</th><th>call site</th></tr></thead>"
            f"<tbody>{body}</tbody></table>{hint}"
        )
