"""Beacons: what a rank says about a long wait, readable by the kernel while the rank is blocked.

A rank that waits more than a few milliseconds at a checked collective or receive writes its
beacon (`distnb.contract.keys.beacon(rank)`): which run it is in, what it waits at and for whom, and
its fingerprint there. The kernel reads beacons for hang reports and to release ranks that wait for
a
peer that will never come (`distnb.session.referee`); peers read them to find deadlocks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum

from distnb.records.codec import Record
from distnb.records.collective import CallSite, Fingerprint, Mismatch

__all__ = ["Beacon", "BeaconState", "WaitKind"]


class BeaconState(str, Enum):
    WAITING = "waiting"  # blocked at a checked call, for `waiting_for`
    RUNNING = "running"  # the long wait ended; the rank runs on
    DEADLOCK = "deadlock"  # this rank found that it and `blocked` wait for each other
    STOPPED = "stopped"  # in the debugger (or `input()`) at `site`, waiting for the user


class WaitKind(str, Enum):
    COLLECTIVE = "collective"  # at (group, seq)
    RECV = "recv"  # for message `seq` from `peer` on the channel (group, peer, rank, tag)
    START = "start"  # for peers to join the checked runtime


@dataclass(frozen=True, slots=True)
class Beacon(Record):
    """One rank's last word about a wait. `wait_id` names the wait, so that a stale beacon is
    never taken for the current one; `blocked` is (peer rank, peer's wait id) of a deadlock.
    `group` is the group as users know it (`WORLD`, `tp`), `group_name` its registered name."""

    rank: int
    state: BeaconState
    run_id: int | None = None
    time: float = 0.0
    wait_id: int = 0
    kind: WaitKind = WaitKind.COLLECTIVE
    group: str = ""
    group_name: str = ""
    seq: int = 0
    op: str = ""
    origin: str = ""
    peer: int = -1
    tag: int = 0
    site: CallSite | None = None
    waiting_for: tuple[int, ...] = ()
    fingerprint: Fingerprint | None = None
    blocked: tuple[int, int] | None = None
    mismatch: Mismatch | None = None

    @property
    def waiting(self) -> bool:
        return self.state is BeaconState.WAITING

    def where(self) -> str:
        """`all_reduce #3 on WORLD (cell In[3] line 2)`; `the debugger at cell In[3] line 2`."""
        if self.state is BeaconState.STOPPED:
            return f"the debugger at {self.site}" if self.site is not None else "the debugger"
        origin = f" [{self.origin}]" if self.origin else ""
        site = f" ({self.site})" if self.site is not None else ""
        return f"{self.op} #{self.seq} on {self.group}{origin}{site}"

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, raw: str | bytes) -> Beacon:
        return cls.from_dict(json.loads(raw))
