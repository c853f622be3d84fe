"""What the SVG and the matplotlib drawings share: the lanes and the colours.

A lane is one rank's collectives in one group. From `GROUP_FROM` ranks on, ranks whose lanes
agree share one, labelled `ranks 0-7 (node0)`: on the same host, the same collectives (group,
seq) from the same call sites, arriving, starting and ending within `tolerance` of each other
(two pixels of a 960-pixel drawing, or the clocks' precision if coarser). A rank keeps a lane
of its own when it arrived last by more than that, when it arrived last (by more than the
clocks' precision) at least twice and `STRAGGLER_SHARE` times as often as its share, when it
was in another collective, or when it sat in a debugger: so who waited for whom still reads.
Hosts never share a lane. Grouping compares each rank with the first rank of each group (not
every pair), so a group's members are all within `tolerance` of one rank, and the same
records give the same lanes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from distnb.ranklist import GROUP_FROM, format_ranks
from distnb.views.timeline.model import Collective, RankSlot, Timeline

__all__ = [
    "WAIT_COLOR",
    "Lane",
    "lane_index",
    "lane_slots",
    "lanes",
    "op_colors",
    "rank_groups",
    "ranks_label",
    "tolerance",
]

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
TOLERANCE_PARTS = 480  # a 960-pixel drawing: ranks closer than 2 pixels look the same
STRAGGLER_SHARE = 3  # last this many times its share of the collectives: a straggler


@dataclass(frozen=True, slots=True)
class Lane:
    """One lane: its ranks (one, or the ranks that agree), its group and its label."""

    ranks: tuple[int, ...]
    group: str
    label: str


@dataclass(frozen=True, slots=True)
class Bar:
    """A lane's part of one collective: its members' slots put together."""

    arrive_ns: int
    start_ns: int
    end_ns: int | None


def op_colors(ops: Iterable[str]) -> dict[str, str]:
    """A fixed colour per op, by name, so every view of a session agrees."""
    return {op: PALETTE[i % len(PALETTE)] for i, op in enumerate(sorted(ops))}


def tolerance(tl: Timeline) -> int:
    """How far apart two ranks' times may be and still share a lane."""
    return max(tl.precision_ns or 0, (tl.t1_ns - tl.t0_ns) // TOLERANCE_PARTS)


def rank_groups(tl: Timeline) -> list[tuple[int, ...]]:
    """The ranks that share a lane, in rank order; one rank each below `GROUP_FROM` ranks."""
    if len(tl.ranks) < GROUP_FROM:
        return [(r,) for r in tl.ranks]
    tol = tolerance(tl)
    calls: dict[int, dict[tuple[str, int], tuple[Collective, RankSlot]]] = {r: {} for r in tl.ranks}
    for c in tl.collectives:
        for s in c.slots:
            calls[s.rank][(c.group, c.seq)] = (c, s)
    alone = {s.rank for s in tl.stops} | {
        c.last_rank for c in tl.collectives if len(c.slots) > 1 and c.lead_ns > tol
    }
    # a rank last by a hair every time is a straggler all the same (the straggler table says
    # so); last now and then, by a hair, is noise: some rank is always last
    fair = sum(s.times_last for s in tl.stragglers) / len(tl.ranks)
    alone |= {s.rank for s in tl.stragglers if s.times_last >= max(2, STRAGGLER_SHARE * fair)}
    groups: list[list[int]] = []
    for r in tl.ranks:
        like = (
            None
            if r in alone
            else next(
                (g for g in groups if g[0] not in alone and _agree(tl, calls, g[0], r, tol)), None
            )
        )
        if like is None:
            groups.append([r])
        else:
            like.append(r)
    return [tuple(g) for g in groups]


def _agree(
    tl: Timeline,
    calls: dict[int, dict[tuple[str, int], tuple[Collective, RankSlot]]],
    a: int,
    b: int,
    tol: int,
) -> bool:
    if tl.hosts.get(a) != tl.hosts.get(b) or calls[a].keys() != calls[b].keys():
        return False
    for key, (_, x) in calls[a].items():
        y = calls[b][key][1]
        if (x.site, x.origin) != (y.site, y.origin) or (x.end_ns is None) != (y.end_ns is None):
            return False
        if max(abs(x.arrive_ns - y.arrive_ns), abs(x.start_ns - y.start_ns)) > tol:
            return False
        if x.end_ns is not None and y.end_ns is not None and abs(x.end_ns - y.end_ns) > tol:
            return False
    return True


def lanes(tl: Timeline, ranks: Collection[int] | None = None) -> list[Lane]:
    """The lanes that have events, rank by rank, groups in `tl.groups` order; from
    `GROUP_FROM` ranks on (and no rank picked), ranks that agree share one."""
    seen = {(s.rank, c.group) for c in tl.collectives for s in c.slots}
    members = rank_groups(tl) if ranks is None else [(r,) for r in tl.ranks if r in ranks]
    return [Lane(m, g, _label(tl, m, g)) for m in members for g in tl.groups if (m[0], g) in seen]


def _label(tl: Timeline, ranks: Sequence[int], group: str) -> str:
    """`rank 1`, `rank 1 tp` when the timeline has more than one group, `rank 1 (node2)` or
    `ranks 0-7 (node0)` when its ranks span hosts."""
    return ranks_label(tl, ranks) + (f" {group}" if len(tl.groups) > 1 else "")


def ranks_label(tl: Timeline, ranks: Sequence[int]) -> str:
    """`rank 1`, `ranks 0-7`; with their host when the ranks span hosts: `ranks 0-7 (node0)`."""
    if len(ranks) == 1:
        return tl.who(ranks[0])
    host = f" ({tl.hosts[ranks[0]]})" if ranks[0] in tl.hosts else ""
    return format_ranks(ranks) + host


def lane_slots(c: Collective, index: dict[tuple[int, str], int]) -> dict[int, Bar]:
    """The collective's bar on each lane of `index` ((rank, group) -> lane): the earliest
    arrival and start of the lane's ranks, and their latest end."""
    bars: dict[int, Bar] = {}
    for s in c.slots:
        lane = index.get((s.rank, c.group))
        if lane is None:
            continue
        had = bars.get(lane)
        if had is None:
            bars[lane] = Bar(s.arrive_ns, s.start_ns, s.end_ns)
            continue
        ends = [e for e in (had.end_ns, s.end_ns) if e is not None]
        bars[lane] = Bar(
            min(had.arrive_ns, s.arrive_ns),
            min(had.start_ns, s.start_ns),
            max(ends) if ends else None,
        )
    return bars


def lane_index(rows: Sequence[Lane]) -> dict[tuple[int, str], int]:
    """(rank, group) -> the index of its lane in `rows`."""
    return {(r, lane.group): i for i, lane in enumerate(rows) for r in lane.ranks}
