"""What a rank does while it waits for its peers: beacon, abort key, deadlock check.

Nothing here runs on the fast path: `exchange.collect` calls `Watch.tick` only once a wait has
lasted `exchange.TICK_NS` (5 ms), and then every 5 ms. Each tick

1. writes this rank's **beacon** (`beacon/<rank>`, JSON) the first time: where it waits (cell,
   group, seq, op, call site, fingerprint) and for whom, so the kernel can tell a hang apart
   from a slow rank, and peers can see what this rank waits in;
2. looks for the kernel's abort key for the current cell (`abort/<cell>`): if set, raises
   `CollectiveDesyncError` with the kernel's reason;
3. reads the beacons of the peers it still waits for. A peer that waits for this rank, in a call
   this rank has not reached (another group's collective, a receive from this rank), can never
   be satisfied while this rank waits where it does: both would hang. This rank then raises a
   `CollectiveMismatchError` (kind "group", "peer" or "op type") and leaves a beacon in state
   "deadlock" naming the peer's wait, so that the peer raises the same error at its next tick.

Beacon states: "waiting" (with the fields above), "running" (a long wait ended), "deadlock".
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch._C._distributed_c10d import Store

from distnb import matching
from distnb.errors import CollectiveDesyncError, CollectiveMismatchError
from distnb.rank import callsite
from distnb.records.collective import CallSite, Fingerprint, Mismatch

__all__ = ["Wait", "Watch", "abort_key", "beacon_key", "mismatch_error", "to_callsite"]


def abort_key(cell: int | None) -> str:
    """Set by the kernel (JSON `{"reason": ...}`) to release ranks waiting in `cell`."""
    return f"abort/{'none' if cell is None else cell}"


def beacon_key(rank: int) -> str:
    return f"beacon/{rank}"


def mismatch_error(mismatch: Mismatch) -> CollectiveMismatchError:
    """The error every rank raises; the record rides along as `err.mismatch`."""
    err = CollectiveMismatchError(mismatch.message)
    err.mismatch = mismatch
    return err


def to_callsite(site: callsite.Site) -> CallSite:
    file, line, cell, code = site
    return CallSite(file, line, None if cell < 0 else cell, code)


class Wait:
    """What a rank waits in: a collective (group, seq) or a receive (message seq from `peer`).

    `ranks` gives the global rank behind each ring being collected; `fingerprint` builds this
    rank's fingerprint (only when a beacon needs it).
    """

    __slots__ = ("fingerprint", "kind", "label", "op", "peer", "ranks", "seq", "site", "tag")

    def __init__(
        self,
        kind: str,
        label: str,
        seq: int,
        op: str,
        site: callsite.Site,
        ranks: Sequence[int],
        fingerprint: Callable[[], Fingerprint] | None = None,
        peer: int = -1,
        tag: int = 0,
    ) -> None:
        self.kind = kind  # "collective", "recv" or "start" (waiting for peers to install)
        self.label = label
        self.seq = seq
        self.op = op
        self.site = site
        self.ranks = ranks
        self.fingerprint = fingerprint
        self.peer = peer
        self.tag = tag


# blocks(this rank's wait, a peer's beacon): can the peer's wait not end while ours lasts?
Blocks = Callable[[Wait, Mapping[str, Any]], bool]


class Watch:
    """The current wait of one rank, and what it tells the kernel and its peers."""

    def __init__(self, store: Store, rank: int, blocks: Blocks) -> None:
        self.store = store
        self.rank = rank
        self.blocks = blocks
        self.cell: int | None = None
        self.current: Wait | None = None
        self.wait_id = 0  # names one wait in beacons, so a stale "deadlock" never matches
        self._beacon_on = False
        self._mine: dict[str, Any] | None = None
        # peer rank -> wait id that looked deadlocked with ours at the last tick
        self._suspects: dict[int, int] = {}

    def start(self, wait: Wait) -> None:
        self.current = wait
        self.wait_id += 1
        self._mine = None
        self._suspects = {}

    def end(self) -> None:
        self.current = None
        if self._beacon_on:
            self._beacon_on = False
            self.beacon({"state": "running"})

    def tick(self, elapsed_ns: int, missing_rings: Sequence[int]) -> None:
        wait = self.current
        if wait is None:
            return
        missing = [wait.ranks[r] for r in missing_rings]
        if not self._beacon_on:
            self._beacon_on = True
            self.beacon(self._waiting(wait, missing))
        self._check_abort(wait, missing)
        if wait.kind != "start":
            self._check_deadlock(wait, missing)

    def beacon(self, fields: Mapping[str, Any]) -> None:
        """Tell the kernel where this rank is (on long waits only: it costs a round trip)."""
        value = {"rank": self.rank, "cell": self.cell, "time": time.time(), **fields}
        # if the control plane is gone, nobody is left to read the beacon
        with contextlib.suppress(RuntimeError):
            self.store.set(beacon_key(self.rank), json.dumps(value))

    def _waiting(self, wait: Wait, missing: Sequence[int]) -> dict[str, Any]:
        mine = self._mine = wait.fingerprint().to_dict() if wait.fingerprint else None
        return {
            "state": "waiting",
            "wait": self.wait_id,
            "kind": wait.kind,
            "group": wait.label,
            "seq": wait.seq,
            "op": wait.op,
            "peer": wait.peer,
            "tag": wait.tag,
            "site": str(to_callsite(wait.site)),
            "code": wait.site[3],
            "waiting_for": list(missing),
            "fingerprint": mine,
        }

    def _check_abort(self, wait: Wait, missing: Sequence[int]) -> None:
        key = abort_key(self.cell)
        if not self.store.check([key]):
            return
        reason = _reason(self.store.get(key))
        who = ", ".join(map(str, missing))
        message = (
            f"{reason}\n  rank {self.rank} was waiting at {wait.op} #{wait.seq} on {wait.label} "
            f"({to_callsite(wait.site)}) for rank(s) {who}"
        )
        raise CollectiveDesyncError(message)

    def _check_deadlock(self, wait: Wait, missing: Sequence[int]) -> None:
        keys = [beacon_key(r) for r in missing]
        if self._mine is None or not self.store.check(keys):
            return
        suspects = {}
        for raw in self.store.multi_get(keys):
            peer = json.loads(raw)
            if peer.get("state") == "deadlock" and peer.get("blocked") == [self.rank, self.wait_id]:
                raise mismatch_error(Mismatch.from_dict(peer["mismatch"]))
            if not (
                peer.get("state") == "waiting"
                and self.rank in peer.get("waiting_for", ())
                and peer.get("fingerprint")
                and self.blocks(wait, peer)
            ):
                continue
            # A beacon can lag behind its rank for a moment (a wait that just ended): believe
            # it only when the same wait is still there one tick later.
            rank, wait_id = int(peer["rank"]), int(peer["wait"])
            if self._suspects.get(rank) != wait_id:
                suspects[rank] = wait_id
                continue
            mine = Fingerprint.from_dict(self._mine)
            found = matching.deadlock(mine, Fingerprint.from_dict(peer["fingerprint"]))
            blocked = [rank, wait_id]
            self.beacon({"state": "deadlock", "blocked": blocked, "mismatch": found.to_dict()})
            self._beacon_on = False  # keep the "deadlock" beacon for the peer to read
            raise mismatch_error(found)
        self._suspects = suspects


def _reason(value: bytes) -> str:
    text = value.decode(errors="replace")
    try:
        parsed = json.loads(text)
    except ValueError:
        return text
    if isinstance(parsed, dict):
        return str(parsed.get("reason") or parsed.get("message") or text)
    return str(parsed)
