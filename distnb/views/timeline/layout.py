"""What the SVG and the matplotlib drawings share: the lanes and the colours."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from distnb.views.timeline.model import Timeline

__all__ = ["WAIT_COLOR", "lane_label", "lanes", "op_colors"]

# tab10 without its grey, which is kept for waits.
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#17becf",
)
WAIT_COLOR = "#9e9e9e"


def op_colors(ops: Iterable[str]) -> dict[str, str]:
    """A fixed colour per op, by name, so every view of a session agrees."""
    return {op: PALETTE[i % len(PALETTE)] for i, op in enumerate(sorted(ops))}


def lanes(tl: Timeline, ranks: Collection[int] | None = None) -> list[tuple[int, str]]:
    """(rank, group) pairs that have events, rank by rank, groups in `tl.groups` order."""
    seen = {(s.rank, c.group) for c in tl.collectives for s in c.slots}
    return [
        (r, g) for r in tl.ranks if ranks is None or r in ranks for g in tl.groups if (r, g) in seen
    ]


def lane_label(tl: Timeline, rank: int, group: str) -> str:
    """The lane's name: `rank 1`, `rank 1 tp` when the timeline has more than one group,
    `rank 1 (node2)` when its ranks span hosts."""
    return tl.who(rank) + (f" {group}" if len(tl.groups) > 1 else "")
