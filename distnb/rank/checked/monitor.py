"""What a rank does while it waits for its peers: beacon, abort key, deadlock check.

Nothing here runs on the fast path: `exchange.collect` calls `WaitMonitor.tick` only once a wait
has lasted `exchange.TICK_NS` (5 ms), and then every 5 ms. Each tick

1. writes this rank's **beacon** (`keys.beacon(rank)`, a `Beacon` record) the first time: where
   it waits (run, group, seq, op, call site, fingerprint) and for whom, so the kernel can tell a
   hang from a slow rank, and peers can see what this rank waits in;
2. looks for the kernel's abort key for the current run (`keys.abort(run_id)`): if set, raises
   `CollectiveDesyncError` with the kernel's reason;
3. reads the beacons of the peers it still waits for. A peer that waits for this rank, in a call
   this rank has not reached (another group's collective, a receive from this rank), can never
   be satisfied while this rank waits where it does: both would hang. This rank then raises a
   `CollectiveMismatchError` (kind "group", "peer" or "op type") and leaves a `DEADLOCK` beacon
   naming the peer's wait, so that the peer raises the same error at its next tick. (Longer
   cycles, A waits for B waits for C waits for A, are found by the kernel's referee.)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence

from torch._C._distributed_c10d import Store

from distnb import judgement
from distnb.contract import keys, posts
from distnb.contract.signed import take_forged
from distnb.errors import CollectiveDesyncError, CollectiveMismatchError
from distnb.rank.checked import callsite
from distnb.ranklist import GROUP_FROM, format_ranks
from distnb.records.beacon import Beacon, BeaconState, WaitKind
from distnb.records.collective import CallSite, Fingerprint, Mismatch

__all__ = ["Wait", "WaitMonitor", "mismatch_error", "to_callsite"]


def mismatch_error(mismatch: Mismatch) -> CollectiveMismatchError:
    """The error every rank raises; the record rides along as `err.mismatch`."""
    return CollectiveMismatchError(mismatch.message, mismatch=mismatch)


def to_callsite(site: callsite.Site) -> CallSite:
    file, line, cell, code = site
    return CallSite(file, line, None if cell < 0 else cell, code)


class Wait:
    """What a rank waits in: a collective (group, seq) or a receive (message seq from `peer`).

    `group` is the group's registered name, `label` the name users know it by; `where` is the
    call site and origin; `ranks` gives the global rank behind each ring being collected;
    `fingerprint` builds this rank's fingerprint (only when a beacon needs it).
    """

    __slots__ = (
        "fingerprint",
        "group",
        "kind",
        "label",
        "op",
        "peer",
        "ranks",
        "seq",
        "tag",
        "where",
    )

    def __init__(
        self,
        kind: WaitKind,
        group: str,
        label: str,
        seq: int,
        op: str,
        where: tuple[callsite.Site, str],
        ranks: Sequence[int],
        fingerprint: Callable[[], Fingerprint] | None = None,
        peer: int = -1,
        tag: int = 0,
    ) -> None:
        self.kind = kind
        self.group = group
        self.label = label
        self.seq = seq
        self.op = op
        self.where = where
        self.ranks = ranks
        self.fingerprint = fingerprint
        self.peer = peer
        self.tag = tag

    @property
    def site(self) -> CallSite:
        return to_callsite(self.where[0])


# blocks(this rank's wait, a peer's beacon): can the peer's wait not end while ours lasts?
Blocks = Callable[[Wait, Beacon], bool]


class WaitMonitor:
    """The current wait of one rank, and what it tells the kernel and its peers."""

    def __init__(self, store: Store, rank: int, blocks: Blocks) -> None:
        self.store = store
        self.rank = rank
        self.blocks = blocks
        self.run_id: int | None = None
        self.current: Wait | None = None
        self.wait_id = 0  # names one wait in beacons, so a stale "deadlock" never matches
        self._beacon_on = False
        self._mine: Fingerprint | None = None
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
            self._post(Beacon(self.rank, BeaconState.RUNNING, self.run_id, time.time()))

    def tick(self, elapsed_ns: int, missing_rings: Sequence[int]) -> None:
        __tracebackhide__ = True  # IPython leaves this frame out of tracebacks
        wait = self.current
        if wait is None:
            return
        missing = [wait.ranks[r] for r in missing_rings]
        if not self._beacon_on:
            self._beacon_on = True
            self._post(self._waiting(wait, missing))
        self._check_abort(wait, missing)
        if wait.kind is not WaitKind.START:
            self._check_deadlock(wait, missing)

    def _post(self, beacon: Beacon) -> None:
        """Tell the kernel where this rank is (on long waits only: it costs a round trip)."""
        # if the control plane is gone, nobody is left to read the beacon
        with contextlib.suppress(RuntimeError):
            posts.post(self.store, keys.beacon(self.rank), beacon.to_json())  # asked for if forged

    def _waiting(self, wait: Wait, missing: Sequence[int]) -> Beacon:
        mine = self._mine = wait.fingerprint() if wait.fingerprint else None
        return Beacon(
            rank=self.rank,
            state=BeaconState.WAITING,
            run_id=self.run_id,
            time=time.time(),
            wait_id=self.wait_id,
            kind=wait.kind,
            group=wait.label,
            group_name=wait.group,
            seq=wait.seq,
            op=wait.op,
            origin=wait.where[1],
            peer=wait.peer,
            tag=wait.tag,
            site=wait.site,
            waiting_for=tuple(missing),
            fingerprint=mine,
        )

    def _check_abort(self, wait: Wait, missing: Sequence[int]) -> None:
        __tracebackhide__ = True  # IPython leaves this frame out of tracebacks
        key = keys.abort(self.run_id)
        if not self.store.check([key]):
            return
        reason = self.store.get(key).decode(errors="replace")
        who = "rank(s) " + ", ".join(map(str, missing))
        if len(wait.ranks) >= GROUP_FROM:  # 31 ranks one by one would fill the line
            who = format_ranks(missing)
        message = (
            f"{reason}\n  rank {self.rank} was waiting at {wait.op} #{wait.seq} on {wait.label} "
            f"({wait.site}) for {who}"
        )
        raise CollectiveDesyncError(message)

    def _check_deadlock(self, wait: Wait, missing: Sequence[int]) -> None:
        __tracebackhide__ = True  # IPython leaves this frame out of tracebacks
        names = [keys.beacon(r) for r in missing]
        if self._mine is None:
            return
        if not self.store.check(names):
            posts.ask_again(self.store, take_forged(self.store))  # a forged beacon: asked again
            return
        suspects = {}
        for raw in filter(None, self.store.multi_get(names)):  # b"": forged since the check
            peer = Beacon.from_json(raw)
            if (
                peer.state is BeaconState.DEADLOCK
                and peer.blocked == (self.rank, self.wait_id)
                and peer.mismatch is not None
            ):
                raise mismatch_error(peer.mismatch)
            if not (
                peer.waiting
                and self.rank in peer.waiting_for
                and peer.fingerprint is not None
                and self.blocks(wait, peer)
            ):
                continue
            # A beacon can lag behind its rank for a moment (a wait that just ended): believe
            # it only when the same wait is still there one tick later.
            if self._suspects.get(peer.rank) != peer.wait_id:
                suspects[peer.rank] = peer.wait_id
                continue
            found = judgement.deadlock(self._mine, peer.fingerprint)
            self._post(
                Beacon(
                    self.rank,
                    BeaconState.DEADLOCK,
                    self.run_id,
                    time.time(),
                    blocked=(peer.rank, peer.wait_id),
                    mismatch=found,
                )
            )
            self._beacon_on = False  # keep the "deadlock" beacon for the peer to read
            raise mismatch_error(found)
        self._suspects = suspects
