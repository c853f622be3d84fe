"""Putting ranks on one clock: offsets of each rank's monotonic clock from the kernel's.

Ranks on one host share a monotonic clock and need none. Across hosts, the kernel asks each rank
for its clock several times and keeps the exchange with the shortest round trip, as NTP does:
the rank read its clock somewhere inside that round trip, so the offset is known to within half
of it, and that half is the stated precision.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from distnb.views.timeline.model import ClockOffsets

SAMPLES = 8


def offset_from(t0: int, rank_ns: int, t1: int) -> tuple[int, int]:
    """(offset, precision) from one exchange: kernel sent at t0, rank read rank_ns, back at t1."""
    return (t0 + t1) // 2 - rank_ns, (t1 - t0 + 1) // 2


def estimate_offsets(call: Callable[..., list[Any]], ranks: Sequence[int]) -> ClockOffsets:
    from distnb.rank import runtime

    best: dict[int, tuple[int, int]] = {}
    for _ in range(SAMPLES):
        for rank in ranks:
            t0 = time.monotonic_ns()
            (rank_ns,) = call(runtime.clock_ns, ranks=[rank])
            offset, precision = offset_from(t0, rank_ns, time.monotonic_ns())
            if rank not in best or precision < best[rank][1]:
                best[rank] = (offset, precision)
    return ClockOffsets(
        {rank: offset for rank, (offset, _) in best.items()},
        max(precision for _, precision in best.values()),
    )
