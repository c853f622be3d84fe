"""`Tiers`: the exchange of a group whose ranks span hosts, in two levels.

On a flat `StoreBoard` every member posts to the one store and polls every peer's key: N posts
and N(N-1) key reads per collective through a single server, which grew 7.5-8x for 4x the
ranks here. In two levels:

1. every member posts its fingerprint on its host's `ShmBoard` (ring = its place on the host);
2. the host's **leader** (its first member in the group's order) collects its host's
   fingerprints and posts one **summary** on the leaders' `StoreBoard` (ring = the host):
   `=` and the core every member of the host posted, if they all posted the same one and that
   core is legal when every member posts it (`legal`, the checker's cached verdict), else `!`;
3. the leaders collect each other's summaries. Equal `=` summaries everywhere: the group agrees,
   and each leader posts `=` on its host's **result ring** (the ring after its members'), which
   its members wait on;
4. otherwise (a mismatch, rare) the details move: each leader posts its host's fingerprints on
   the details `StoreBoard`, collects the other hosts', and posts every member's fingerprint, in
   the group's order, on its result ring (spilled to the store when larger than a slot). Every
   member then judges all N fingerprints, as on a flat board, and raises the same error.

Per collective the store sees H posts and H polls of H-1 keys (H hosts), instead of N and N of
N-1. Depth 2 holds on every board for the reason the package's docstring gives: a member posts
s after reading result s-1, which its leader posts after reading every summary s-1.

From `SPREAD_HOSTS` hosts on (the model's crossover: below it, its rounds cost more than one
read of every summary), step 3 is a **dissemination** among the leaders (as in the
dissemination barrier of Hensgen, Finkel and Manber): in round r = 0, 1, ... ceil(log2 H) - 1,
leader h posts what it knows (`AGREED` and the core, if every host it has heard of, itself
included, said so; else `!`) on its ring r and reads the ring r of leader h - 2^r (mod H),
keeping the agreement only if both agree. After the last round each leader has heard, through
chains of reads, from every host: the same outcome everywhere, from log2 H posts and reads per
leader (H log H key reads per collective, not H(H-1)). Depth 2 still holds: a leader's result at
s-1 comes after every host's round-0 post of s-1, which each makes after its whole exchange at
s-2, so the reads of its s-2 posts are done when it posts s.

Who a waiting member is waiting for (its beacon's `waiting_for`, which the kernel's referee
reads) is exact on its own host (the host's rings) and, for another host, every member of a host
whose summary has not come (the store cannot tell which of them is late; the referee blames only
the ranks among them that are done, so its verdict is unchanged).
"""

from __future__ import annotations

import functools
import marshal
import os
import time
from collections.abc import Callable, Sequence

from distnb.rank.checked.exchange.board import LAPPED, Board
from distnb.rank.checked.exchange.shm import ShmBoard
from distnb.rank.checked.exchange.store import StoreBoard
from distnb.rank.checked.exchange.wait import poll_once

__all__ = [
    "AGREED",
    "SETTLE_S",
    "SPREAD_HOSTS",
    "SPREAD_VAR",
    "Gather",
    "Missing",
    "Tiers",
    "hosts_of",
    "rounds",
]

AGREED = b"="
_DIFFER = b"!"
# From this many hosts on, the leaders agree by dissemination: near where the model puts the
# crossover (`bench/bench_scale.py --part model`: 107-835 hosts across runs here; it moves
# with the store's costs). Measured at 8, 16 and 32 single-rank hosts on 2 cores (32 of them
# rehearsal hosts: `bench/bench_spread_hosts.py`), the rounds cost more than every leader
# reading every summary. `DISTNB_SPREAD_HOSTS` sets it (tests).
SPREAD_HOSTS = 128
SPREAD_VAR = "DISTNB_SPREAD_HOSTS"
_ABORTED = b"x"
SETTLE_S = 5.0  # how long a member waits for its leader's word after its wait was ended

# gather(board, rings, stamp, missing): the payloads of `rings` at `stamp` (None: not all there,
# for a gather that must not wait); `missing(rings)` names the group members behind missing rings
Missing = Callable[[Sequence[int]], list[int]]
Gather = Callable[[Board, Sequence[int], int, Missing], "list[bytes] | None"]
Legal = Callable[[bytes], bool]  # legal(core): may every member post this same core?


def rounds(hosts: int) -> int:
    """The leaders' rounds of agreement among `hosts` hosts (1: every leader reads every
    other's summary at once; see the module)."""
    spread = int(os.environ.get(SPREAD_VAR) or SPREAD_HOSTS)
    return 1 if hosts < spread else (hosts - 1).bit_length()


def hosts_of(identities: Sequence[str]) -> list[list[int]]:
    """Members' indexes grouped by host, hosts in order of their first member."""
    hosts: dict[str, list[int]] = {}
    for i, ident in enumerate(identities):
        hosts.setdefault(ident, []).append(i)
    return list(hosts.values())


class Tiers:
    """One member's side of a two-level exchange (see the module's docstring).

    `hosts[h]` lists the group indexes of host h's members; `index` is this member's.
    """

    def __init__(
        self,
        hosts: Sequence[Sequence[int]],
        index: int,
        local: ShmBoard,
        leaders: StoreBoard | None,
        details: StoreBoard | None,
        core_of: Callable[[bytes], bytes],
    ) -> None:
        """`core_of(payload)` is a payload's core (`wire.core_bytes`)."""
        self.core_of = core_of
        self.hosts = [list(h) for h in hosts]
        self.host = next(h for h, m in enumerate(self.hosts) if index in m)
        self.mine = self.hosts[self.host]
        self.slot = self.mine.index(index)  # this member's ring on its host's board
        self.result_ring = len(self.mine)
        self.abort_ring = len(self.mine) + 1  # the leader's word that it withdrew
        self.others = [h for h in range(len(self.hosts)) if h != self.host]
        self.size = sum(len(h) for h in self.hosts)
        self.local, self.leaders, self.details = local, leaders, details
        self.posted: list[tuple[Board, int, int]] = []  # what `withdraw` takes back
        self.rounds = rounds(len(self.hosts))  # the leaders' board: ring host * rounds + round
        self._known: tuple[int, int, bytes] = (0, 0, b"")  # (stamp, rounds done, agreement)

    @property
    def leader(self) -> bool:
        return self.slot == 0

    def exchange(
        self, stamp: int, payload: bytes, core: bytes, legal: Legal, gather: Gather
    ) -> bytes | list[bytes] | None:
        """AGREED, every member's payload in the group's order, or None (`gather` came back
        without them: only a gather that must not wait does that)."""
        self.posted, self._known = [], (0, 0, b"")
        if self.leader:  # a word from an earlier try at this stamp is void: this one starts
            self.local.retract(self.abort_ring, stamp)
        self._post(self.local, self.slot, stamp, payload)
        return self.finish(stamp, payload, core, legal, gather)

    def finish(
        self, stamp: int, payload: bytes, core: bytes, legal: Legal, gather: Gather
    ) -> bytes | list[bytes] | None:
        """The exchange after this member's post (again, with a gather that never waits, after
        Ctrl-C); see `exchange`."""
        if not self.leader:
            got = gather(self.local, [self.result_ring], stamp, self._missing_local)
            return None if got is None else _result(got[0])
        host = gather(self.local, list(range(1, len(self.mine))), stamp, self._missing_local)
        if host is None:
            return None
        host.insert(0, payload)
        same = all(self.core_of(p) == core for p in host) and legal(core)
        summary = AGREED + core if same else _DIFFER
        agreed = self._agree(stamp, summary, gather)
        if agreed is None:
            return None
        if agreed:
            self.local.post(self.result_ring, stamp, AGREED)
            return AGREED
        remote = self._across(self.details, stamp, marshal.dumps(host), gather)
        if remote is None:
            return None
        every: list[bytes] = [LAPPED] * self.size
        for h, blob in zip([self.host, *self.others], [marshal.dumps(host), *remote], strict=True):
            for i, p in zip(self.hosts[h], marshal.loads(blob), strict=True):
                every[i] = p
        self.local.post(self.result_ring, stamp, marshal.dumps(every))
        return every

    def _agree(self, stamp: int, summary: bytes, gather: Gather) -> bool | None:
        """Whether every host's summary is `summary`, itself an agreement (None: `gather` came
        back without what it needed; a later call goes on from there)."""
        if self.leaders is None:
            return summary != _DIFFER
        if self.rounds == 1:
            theirs = self._across(self.leaders, stamp, summary, gather)
            return None if theirs is None else all(s == summary != _DIFFER for s in theirs)
        done, known = (self._known[1], self._known[2]) if self._known[0] == stamp else (0, summary)
        hosts = len(self.hosts)
        for r in range(done, self.rounds):
            ring = self.host * self.rounds + r
            if (self.leaders, ring, stamp) not in self.posted:
                self._post(self.leaders, ring, stamp, known)
            before = (self.host - (1 << r)) % hosts  # its word covers hosts before..before-2^r+1
            heard = [(before - k) % hosts for k in range(1 << r)]
            missing = functools.partial(_late, self._missing_hosts, heard)
            got = gather(self.leaders, [before * self.rounds + r], stamp, missing)
            if got is None:
                self._known = (stamp, r, known)
                return None
            known = known if got[0] == known else _DIFFER
        self._known = (stamp, self.rounds, known)
        return known == summary != _DIFFER

    def _across(
        self, board: StoreBoard | None, stamp: int, value: bytes, gather: Gather
    ) -> list[bytes] | None:
        """Post `value` for the other hosts' leaders on `board` and gather theirs (nothing to
        do for a group on one host)."""
        if board is None:
            return []
        if (board, self.host, stamp) not in self.posted:
            self._post(board, self.host, stamp, value)
        return gather(board, self.others, stamp, self._missing_hosts)

    def settle(
        self, stamp: int, payload: bytes, core: bytes, legal: Legal
    ) -> bytes | list[bytes] | None:
        """After a wait ended early (the kernel's abort key, Ctrl-C): the exchange's outcome if
        it can end now, else None, and the member withdraws.

        Members follow their leader, so that a host never splits: a leader that cannot end the
        exchange says so on its abort ring before it withdraws; a member whose leader is in
        this exchange waits (up to `SETTLE_S`) for its result or that word. (The kernel's abort
        can be late: ranks that raised a mismatch, found after every member posted, are done
        while members still wait for their leader's result; those members must take the
        result, not withdraw, or their seq would fall behind their leader's.)"""

        def gather(board: Board, rings: Sequence[int], s: int, _: Missing) -> list[bytes] | None:
            return poll_once(board, rings, s)

        if self.leader:
            got = self.finish(stamp, payload, core, legal, gather)
            if got is None:
                self.local.post(self.abort_ring, stamp, _ABORTED)
            return got
        deadline = time.monotonic() + SETTLE_S
        while self.local.read(0, stamp) not in (None, LAPPED):  # the leader is in it
            result = self.local.read(self.result_ring, stamp)
            if result not in (None, LAPPED):
                assert result is not None
                return _result(result)
            if self.local.read(self.abort_ring, stamp) == _ABORTED or time.monotonic() > deadline:
                return None
            time.sleep(0.001)
        return None

    def withdraw(self) -> None:
        """Take back what this member posted for its last exchange."""
        for board, ring, stamp in self.posted:
            board.retract(ring, stamp)
        self.posted = []

    def _post(self, board: Board, ring: int, stamp: int, payload: bytes) -> None:
        self.posted.append((board, ring, stamp))
        board.post(ring, stamp, payload)

    def _missing_local(self, rings: Sequence[int]) -> list[int]:
        """Group indexes behind missing rings of the host's board. A member waiting for its
        result names the host's members that have not posted and, once all have, every member of
        the hosts whose summary has not come."""
        if list(rings) != [self.result_ring]:
            return [self.mine[r] for r in rings]
        stamp = self._stamp()
        late = [self.mine[r] for r in range(len(self.mine)) if self.local.read(r, stamp) is None]
        if late:
            return late
        if self.leaders is None:
            return []
        summaries = self.leaders.read_many([h * self.rounds for h in self.others], stamp)
        return self._missing_hosts([h for h, s in zip(self.others, summaries) if s is None])

    def _missing_hosts(self, hosts: Sequence[int]) -> list[int]:
        return sorted(i for h in hosts for i in self.hosts[h])

    def _stamp(self) -> int:
        return self.posted[0][2] if self.posted else 0

    def forget(self) -> None:
        self.local.forget()

    def close(self, unlink: bool) -> None:
        self.local.close(unlink)
        for board in (self.leaders, self.details):
            if board is not None:
                board.close(unlink)


def _late(hosts_missing: Missing, heard: list[int], _: Sequence[int]) -> list[int]:
    """Who a leader waits for in a round: every member of the hosts its partner's word covers
    (the store cannot tell which of them is late)."""
    return hosts_missing(heard)


def _result(value: bytes) -> bytes | list[bytes]:
    if value == AGREED:
        return AGREED
    every: list[bytes] = marshal.loads(value)
    return every
