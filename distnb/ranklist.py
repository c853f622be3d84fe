"""Rank lists as people read them: one spelling everywhere, `"ranks 0-2,5"` and `"rank 3"`.

A leaf module (it imports nothing of distnb), so records, matching, errors and views can all use
it without importing each other.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["format_ranks"]


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
