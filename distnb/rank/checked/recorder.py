"""A bounded ring of the collectives this rank ran, for the timeline.

Adding an event must cost well under the 5 us budget, so the ring holds plain lists (one
allocation, no dataclass `__init__`); `CollectiveEvent` records are built only when asked for.
Lists rather than tuples because an async op's end time is filled in later, from a callback.
"""

from __future__ import annotations

from typing import Any

from distnb.errors import ConfigError
from distnb.records.collective import CallSite, CollectiveEvent

__all__ = [
    "ARRIVE",
    "END",
    "GROUP",
    "NBYTES",
    "OP",
    "ORIGIN",
    "RANK",
    "RUN",
    "SEQ",
    "SITE",
    "SIZE",
    "START",
    "Recorder",
    "entry_event",
]

# An entry is a list, its slots named here (a list costs one allocation and no `__init__`):
# [rank, group (its label), seq, op, nbytes, site, arrive_ns, start_ns, end_ns, run_id, group
# size, origin], where site is `callsite.Site`: (file, line, cell or -1, code). The agent's tape
# adds two slots of its own after these (`distnb.rank.agent.tape`).
RANK, GROUP, SEQ, OP, NBYTES, SITE, ARRIVE, START, END, RUN, SIZE, ORIGIN = range(12)


class Recorder:
    """The last `size` events; older ones are overwritten."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ConfigError(f"ring_size must be at least 1, got {size}")
        self.size = size
        self.ring: list[list[Any] | None] = [None] * size
        self.count = 0

    def add(self, entry: list[Any]) -> None:
        self.ring[self.count % self.size] = entry
        self.count += 1

    def events(self, since_run: int | None = None) -> list[CollectiveEvent]:
        """Oldest first; with `since_run`, only events of that run and later ones."""
        start = max(0, self.count - self.size)
        out = []
        for i in range(start, self.count):
            entry = self.ring[i % self.size]
            if entry is None:
                continue
            run_id = entry[RUN]
            if since_run is not None and (run_id is None or run_id < since_run):
                continue
            out.append(entry_event(entry))
        return out

    def clear(self) -> None:
        self.ring = [None] * self.size
        self.count = 0


def entry_event(e: list[Any]) -> CollectiveEvent:
    """The `CollectiveEvent` of a ring entry."""
    file, line, cell, code = e[SITE]
    return CollectiveEvent(
        rank=e[RANK],
        group=e[GROUP],
        seq=e[SEQ],
        op=e[OP],
        nbytes=e[NBYTES],
        site=CallSite(file, line, None if cell < 0 else cell, code),
        arrive_ns=e[ARRIVE],
        start_ns=e[START],
        end_ns=e[END],
        run_id=e[RUN],
        group_size=e[SIZE],
        origin=e[ORIGIN],
    )
