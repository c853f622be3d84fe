"""Rows of many ranks read like rows of a few: ranks whose rows agree share one.

At 32 ranks a table with a row per rank is 32 lines that say the same thing; what a reader
wants is what differs. `group_rows` keeps the columns that identify a rank apart (its number,
pid, device index, memory) out of the comparison and merges the ranks whose other cells agree
into one row: `0-7` in the rank column, `8 pids`, `cuda:0-7`, `1.1-1.3 GiB`. Hosts are a
column like any other, so each host gets its own rows, and a rank that differs stands alone.
The grouping itself (`same_ranks`) and `GROUP_FROM` live in `distnb.ranklist`, which messages
built outside the views (mismatches, hang reports) use too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from distnb.ranklist import GROUP_FROM, format_ranks, same_ranks

__all__ = ["GROUP_FROM", "group_rows", "span"]

_INDEXED = re.compile(r"^(.*?)(\d+)$")


def span(values: Sequence[str]) -> str:
    """One cell for a group's values: the value if they agree, `cuda:0-7` for indexed names,
    `lo-hi` for sizes (`1.1 GiB` ... `1.3 GiB` -> `1.1-1.3 GiB`), else `N values`."""
    distinct = list(dict.fromkeys(values))
    if len(distinct) == 1:
        return distinct[0]
    indexed = [_INDEXED.match(v) for v in distinct]
    if all(indexed) and len({m.group(1) for m in indexed if m}) == 1:
        first = indexed[0]
        assert first is not None
        numbers = [int(m.group(2)) for m in indexed if m]
        return first.group(1) + format_ranks(numbers).split(" ", 1)[1]
    return f"{len(distinct)} values"


def group_rows(
    rows: Sequence[tuple[str, ...]],
    ranks: Sequence[int],
    apart: Sequence[int],
    cell: Callable[[int, list[int]], str | None] | None = None,
) -> list[tuple[str, ...]]:
    """`rows[i]` belongs to `ranks[i]`; column 0 is the rank. Rows equal outside the columns in
    `apart` merge: column 0 becomes the ranks (`0-7`), each column in `apart` one cell:
    `cell(column, row indexes)` if it gives one, else `span` of the values. Groups keep the
    order of their first rank."""
    keyed = (
        (i, tuple(v for c, v in enumerate(row) if c != 0 and c not in apart))
        for i, row in enumerate(rows)
    )
    merged = []
    for members, _ in same_ranks(keyed):
        first = rows[members[0]]
        out = list(first)
        out[0] = format_ranks(ranks[i] for i in members).split(" ", 1)[1]
        for c in apart:
            text = cell(c, members) if cell is not None else None
            out[c] = text if text is not None else span([rows[i][c] for i in members])
        merged.append(tuple(out))
    return merged
