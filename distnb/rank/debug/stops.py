"""When this rank sat stopped in a debugger: the stretches the timeline leaves out of waiting.

A rank stopped at a prompt (pdb, `input()`) or in JupyterLab's debugger holds its peers up at
their next collective; that wait is the user's reading time, not a straggler's. Each stop is
kept here, on the clock collective events are stamped with (`time.monotonic_ns()`), with its
run, so that the timeline can show it as "stopped in the debugger"
(`distnb.views.timeline.model`). Bounded: the oldest stops go first.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

from distnb.records.debug import DebugStop

__all__ = ["KEPT", "begin_run", "stopped", "stops"]

KEPT = 4096

_stops: deque[DebugStop] = deque(maxlen=KEPT)
_run: list[int] = [0]
_rank: list[int] = [0]


def begin_run(rank: int, run_id: int) -> None:
    """Stops from now on belong to run `run_id` of `rank`."""
    _rank[0], _run[0] = rank, run_id


@contextmanager
def stopped() -> Iterator[None]:
    """The block is time this rank sat stopped in a debugger."""
    start = time.monotonic_ns()
    try:
        yield
    finally:
        _stops.append(DebugStop(_rank[0], start, time.monotonic_ns(), _run[0]))


def stops(since_run: int | None = None) -> list[DebugStop]:
    """This rank's stops, oldest first; with `since_run`, those of that run and later."""
    return [s for s in _stops if since_run is None or s.run_id >= since_run]
