"""Circular waits, found from the beacons: ranks that each wait for the next, so none goes on.

Each waiting rank's beacon says what it waits in (a collective at (group, seq), or a receive) and
for whom. Rank A is **blocked by** rank B when B is one A waits for and B itself waits in a
different call: B cannot post what A needs until its own wait ends. A cycle of such edges (A by
B, B by C, ..., back to A) can never end. Two ranks in a cycle are also found by the ranks
themselves (`distnb.rank.checked.monitor`); longer cycles, across any groups, only here, where
every rank's beacon can be read. Pure functions over `Beacon` records.
"""

from __future__ import annotations

from collections.abc import Sequence

from distnb.records.beacon import Beacon, WaitKind

__all__ = ["cycle_reason", "find_cycle", "held_up_by"]


def find_cycle(beacons: Sequence[Beacon], run_id: int) -> list[Beacon] | None:
    """The beacons of a cycle of ranks blocked by each other in run `run_id`, or None."""
    waiting = {b.rank: b for b in beacons if b.waiting and b.run_id == run_id}
    blocked_by = {
        rank: [p for p in b.waiting_for if p in waiting and _differs(b, waiting[p])]
        for rank, b in waiting.items()
    }
    for start in sorted(waiting):
        path: list[int] = []
        rank: int | None = start
        while rank is not None and rank not in path:
            path.append(rank)
            nexts = blocked_by.get(rank, [])
            rank = nexts[0] if nexts else None
        if rank is not None:  # came back to a rank on the path: a cycle
            cycle = path[path.index(rank) :]
            first = cycle.index(min(cycle))  # the same cycle reads the same from any start
            return [waiting[r] for r in cycle[first:] + cycle[:first]]
    return None


def held_up_by(beacon: Beacon, beacons: Sequence[Beacon]) -> tuple[int, ...]:
    """The ranks that have not reached `beacon`'s collective: what every rank waiting at it
    waits for in the end.

    A beacon says whom the rank missed when it began to wait; a peer that reached the same
    collective since (its fingerprint still on its way through its host's leader) waits too and
    holds nobody up. At 10 ranks on two hosts the waiters of one collective named `ranks 1-4`,
    `ranks 5-9`, `ranks 5,7`, `ranks 5-7` when all of them waited for rank 7, asleep. Of
    everything the collective's waiters missed, the ranks not waiting at it themselves are the
    ones holding it up; if there are none (or the wait is a receive), the beacon's own list
    stands."""
    if beacon.kind is not WaitKind.COLLECTIVE:
        return beacon.waiting_for
    at = [
        b
        for b in beacons
        if b.waiting
        and b.run_id == beacon.run_id
        and b.kind is WaitKind.COLLECTIVE
        and (b.group_name, b.seq) == (beacon.group_name, beacon.seq)
    ]
    there = {b.rank for b in at} | {beacon.rank}
    missed = {r for b in [beacon, *at] for r in b.waiting_for}
    return tuple(sorted(missed - there)) or beacon.waiting_for


def cycle_reason(cycle: Sequence[Beacon]) -> str:
    """The sentence every rank of the cycle raises with."""
    waits = "; ".join(
        f"rank {b.rank} waits in {_where(b)} for rank {cycle[(i + 1) % len(cycle)].rank}"
        for i, b in enumerate(cycle)
    )
    return (
        f"deadlock: {len(cycle)} ranks wait for each other in a circle ({waits}); none can go "
        "on. Each rank must call the collectives of the groups it shares in the same order."
    )


def _differs(a: Beacon, b: Beacon) -> bool:
    """Does `b` wait in another call than `a` (so `a` cannot get what it needs from `b`)?"""
    if a.kind is WaitKind.RECV or b.kind is WaitKind.RECV:
        return (a.kind, a.group_name, a.seq, a.peer) != (b.kind, b.group_name, b.seq, b.peer)
    return (a.group_name, a.seq) != (b.group_name, b.seq)


def _where(b: Beacon) -> str:
    site = f" at {b.site}" if b.site is not None else ""
    if b.kind is WaitKind.RECV:
        return f"{b.op} #{b.seq} from rank {b.peer} on {b.group}{site}"
    return f"{b.op} #{b.seq} on {b.group}{site}"
