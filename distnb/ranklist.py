"""Rank lists as people read them: one spelling everywhere, `"ranks 0-2,5"` and `"rank 3"`,
and ranks that say the same thing said once (`same_ranks`).

A leaf module (it imports nothing of distnb), so records, matching, errors and views can all use
it without importing each other. At 32 ranks a message with a line per rank is 32 lines that say
the same thing: from `GROUP_FROM` ranks on, tables (`views/grouping.py`), mismatch messages, hang
reports and views give one line to the ranks that agree and one to each odd one out.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import TypeVar

__all__ = ["GROUP_FROM", "format_ranks", "same_ranks"]

GROUP_FROM = 9  # this many ranks or more are grouped (8 lines still read at a glance)

K = TypeVar("K", bound=Hashable)


def format_ranks(ranks: Iterable[int], none: str = "no rank") -> str:
    """`[0, 1, 2, 5]` -> `"ranks 0-2,5"`; `[3]` -> `"rank 3"`; `[]` -> `none`."""
    ordered = sorted(set(ranks))
    if not ordered:
        return none
    if len(ordered) == 1:
        return f"rank {ordered[0]}"
    spans: list[str] = []
    start = prev = ordered[0]
    for r in [*ordered[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return "ranks " + ",".join(spans)


def same_ranks(keyed: Iterable[tuple[int, K]]) -> list[tuple[list[int], K]]:
    """(rank, what it says) pairs -> (ranks that say it, what), in the order of each first rank.

    >>> same_ranks([(0, "a"), (1, "b"), (2, "a")])
    [([0, 2], 'a'), ([1], 'b')]
    """
    groups: dict[K, list[int]] = {}
    for rank, key in keyed:
        groups.setdefault(key, []).append(rank)
    return [(ranks, key) for key, ranks in groups.items()]
