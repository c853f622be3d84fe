"""The answer to a replica check, as text and as an HTML table.

All agree: one line (how many tensors and bytes were compared, on which ranks). Otherwise one
row per name that differs: the groups of ranks that agree with each other (`ranks 0,2 | 1,3`),
the largest absolute and relative difference and where.

From `GROUP_FROM` ranks on, ranks read as spans (`ranks 0-30 | 31`) and the summary says who
stands apart once, above the table: `ranks 0-30 agree; rank 31 differs in fc.weight, fc.bias`
(ranks that differ in the same names share a part), so 32 ranks read like 2.
"""

from __future__ import annotations

from typing import Any

from distnb.ranklist import GROUP_FROM, format_ranks, same_ranks
from distnb.records.replicas import Difference, ReplicaReport, WatchReport
from distnb.views._format import (
    DIFF_ROW_BG,
    HEADING_STYLE,
    Row,
    format_bytes,
    html_block,
    html_table,
    text_table,
)

__all__ = ["ReplicaView", "WatchView"]

HEADER = ("name", "ranks that agree", "max |diff|", "max rel", "at")
NAMES_LISTED = 3  # names spelled out per odd rank in the summary; the rest are counted


class ReplicaView:
    """`Session.diff`'s result: `.report` holds the record; shows itself in IPython."""

    def __init__(self, report: ReplicaReport) -> None:
        self.report = report

    @property
    def agree(self) -> bool:
        return self.report.agree

    def summary(self) -> str:
        r = self.report
        where = f"on {format_ranks(r.ranks)}"
        size = f"{r.compared} tensors and values ({format_bytes(r.nbytes)})"
        notes = []
        if r.alone:
            notes.append(f"{r.alone} sharded, with no replica to compare")
        if r.within_atol:
            notes.append(f"{r.within_atol} differ within atol")
        tail = f"; {', '.join(notes)}" if notes else ""
        if r.expect == "differ":
            if not r.differences:
                return f"replicas differ as expected: {size} compared {where}{tail}"
            return (
                f"identical where they should differ: {len(r.differences)} of {r.compared} "
                f"{where} (each rank's data should be its own: a DistributedSampler?){tail}"
            )
        if r.agree:
            if not r.compared and len(r.ranks) < 2:
                return f"nothing to compare {where}: one rank holds the only copy of each tensor"
            if not r.compared:
                return f"nothing to compare {where}: every tensor is sharded (no replicas)"
            return f"replicas agree: {size} compared {where}{tail}"
        return f"replicas differ: {len(r.differences)} of {size} {where}{tail}"

    def rows(self) -> list[list[str]]:
        many = len(self.report.ranks) >= GROUP_FROM
        out = [_row(d, many) for d in self.report.differences]
        for name, lacking in self.report.missing:
            out.append([name, f"missing on {format_ranks(lacking)}", "", "", ""])
        return out

    def odd_ones(self) -> str:
        """From `GROUP_FROM` ranks on, when replicas differ: `ranks 0-30 agree; rank 31 differs
        in fc.weight, fc.bias` (each name's largest group of agreeing ranks is the reference);
        "" otherwise."""
        r = self.report
        if len(r.ranks) < GROUP_FROM or r.agree or r.expect != "same":
            return ""
        names: dict[int, list[str]] = {}
        for d in r.differences:
            for rank in sorted(x for g in d.agree[1:] for x in g):
                names.setdefault(rank, []).append(d.name)
        lacks: dict[int, list[str]] = {}
        for name, lacking in r.missing:
            for rank in lacking:
                lacks.setdefault(rank, []).append(name)
        parts = [
            _part(ranks, ("differs in", "differ in"), found)
            for ranks, found in same_ranks((k, tuple(v)) for k, v in sorted(names.items()))
        ] + [
            _part(ranks, ("lacks", "lack"), found)
            for ranks, found in same_ranks((k, tuple(v)) for k, v in sorted(lacks.items()))
        ]
        agree = [x for x in r.ranks if x not in names and x not in lacks]
        head = f"{format_ranks(agree)} agree" if len(agree) > 1 else ""
        return "; ".join([head, *parts] if head else parts)

    def heading(self) -> list[str]:
        """The summary, and from `GROUP_FROM` ranks on who stands apart."""
        return [line for line in (self.summary(), self.odd_ones()) if line]

    def __str__(self) -> str:
        rows = self.rows()
        heading = "\n".join(self.heading())
        return heading + ("\n" + text_table(HEADER, rows) if rows else "")

    def __repr__(self) -> str:
        return str(self)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    def widget(self) -> Any:
        """An `ipywidgets.VBox`: a name filter above the table."""
        import ipywidgets as w  # views are the only place ipywidgets is imported, lazily

        pattern = w.Text(placeholder="filter names (substring)", description="name")
        out = w.HTML(self._repr_html_())

        def refresh(_: object = None) -> None:
            out.value = self._repr_html_(pattern.value)

        pattern.observe(refresh, names="value")
        return w.VBox([pattern, out])

    def _repr_html_(self, only: str = "") -> str:
        rows = [r for r in self.rows() if only in r[0]]
        table = html_table(HEADER, [Row(r, DIFF_ROW_BG, "differs") for r in rows]) if rows else ""
        return html_block(self.heading(), HEADING_STYLE, bold=bool(rows)) + table


class WatchView:
    """What a replica watch saw (`Session.diff_report`): `.report` holds the record."""

    def __init__(self, report: WatchReport) -> None:
        self.report = report

    def summary(self) -> str:
        r = self.report
        where = f"on {format_ranks(r.ranks)}"
        if not r.steps:
            return f"{r.name}: no step watched yet {where}"
        span = f"{len(r.steps)} steps watched ({r.steps[0]}-{r.steps[-1]})"
        if r.first is None:
            return f"replicas of {r.name} agree at all {span} {where}"
        return (
            f"replicas of {r.name} first differ at step {r.first} ({span} {where}): "
            f"{', '.join(d.name for d in r.differences)}"
        )

    def rows(self) -> list[list[str]]:
        many = len(self.report.ranks) >= GROUP_FROM
        return [_row(d, many)[:2] for d in self.report.differences]

    def __str__(self) -> str:
        rows = self.rows()
        return self.summary() + ("\n" + text_table(HEADER[:2], rows) if rows else "")

    def __repr__(self) -> str:
        return str(self)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    def widget(self) -> Any:
        import ipywidgets as w  # views are the only place ipywidgets is imported, lazily

        return w.HTML(self._repr_html_())

    def _repr_html_(self) -> str:
        rows = [Row(row, DIFF_ROW_BG, "differs") for row in self.rows()]
        table = html_table(HEADER[:2], rows) if rows else ""
        return html_block(self.summary(), HEADING_STYLE, bold=bool(rows)) + table


def _row(d: Difference, many: bool = False) -> list[str]:
    """A name's row; `many`: groups of ranks as spans (`0-30 | 31`), not one by one."""

    def ranks(group: tuple[int, ...]) -> str:
        return format_ranks(group).split(" ", 1)[1] if many else ",".join(map(str, group))

    agree = " | ".join(ranks(g) for g in d.agree) if many else d.groups
    if d.values:
        agree = " | ".join(f"{ranks(g)}: {v}" for g, v in zip(d.agree, d.values))
    if d.max_abs is None:
        return [d.name, agree, "", "", ""]
    return [d.name, agree, f"{d.max_abs:.3g}", f"{d.max_rel:.3g}", str(list(d.index))]


def _part(ranks: list[int], verbs: tuple[str, str], names: tuple[str, ...]) -> str:
    """`rank 31 differs in a, b`; `ranks 4,9 lack c, d, e and 2 more` (`verbs`: for one rank,
    for several)."""
    listed = ", ".join(names[:NAMES_LISTED])
    more = f" and {len(names) - NAMES_LISTED} more" if len(names) > NAMES_LISTED else ""
    return f"{format_ranks(ranks)} {verbs[len(ranks) > 1]} {listed}{more}"
