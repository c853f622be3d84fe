"""The groups and channels a rank's checker has met, and the boards their fingerprints use.

A group posts on one board (`c-<name>`), a point-to-point channel on one of its own
(`p-<group>-<src>-<dst>-<tag>`). A board whose members all share a host (as `hosts` says, or
else by `host_identity`: host name, boot and /dev/shm mount, which each rank posts at install)
is in shared memory (`exchange.ShmBoard`); one whose members are each on a host of their own
is in the control plane's store (`exchange.StoreBoard`); a group with several members on some
of several hosts exchanges in two levels (`exchange.Tiers`: shared memory on each host, the
hosts' leaders through the store). Boards are named after the checker's generation, so groups
made after `forget_groups` never meet old ones.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from typing import Any

import torch.distributed as dist
from torch._C._distributed_c10d import Store
from torch.distributed import distributed_c10d as c10d

from distnb.contract import keys, posts
from distnb.contract.signed import take_forged
from distnb.rank.checked import callsite, exchange, wire
from distnb.rank.checked.monitor import Wait, WaitMonitor
from distnb.records.beacon import WaitKind

__all__ = [
    "FLAT_MAX",
    "P2P_SLOT_SIZE",
    "SHM_VAR",
    "SLOT_SIZE",
    "Channel",
    "Group",
    "Groups",
    "group_label",
    "host_identity",
]

# A group of at least this many ranks on one host exchanges through a leader too (`Tiers` with one
# host): each member sleeps until one post, its leader's, instead of waking for each peer's.
FLAT_MAX = 8
SLOT_SIZE = 16 * 1024  # one fingerprint; bigger ones spill into the store
P2P_SLOT_SIZE = 2 * 1024

Channel = tuple[str, int, int, int]  # (group name, src, dst, tag), global ranks


# Set on the ranks to rehearse hosts on one machine: "0" makes every rank a host of its own, so
# fingerprints go through the control plane's store as between hosts; a number k > 0 makes
# ranks 0..k-1 one host, k..2k-1 the next, and so on (shared memory within, the store between:
# the two-level exchange, `exchange.Tiers`).
SHM_VAR = "DISTNB_SHM"


def host_identity(rank: int = 0) -> str:
    """Ranks with equal identities can share /dev/shm: same host, boot and tmpfs mount (or the
    same rehearsal host, as `SHM_VAR` says)."""
    rehearsal = os.environ.get(SHM_VAR, "")
    if rehearsal == "0":
        return f"{socket.gethostname()}|pid{os.getpid()}"
    if rehearsal.isdigit():
        return f"{socket.gethostname()}|rehearsal{rank // int(rehearsal)}"
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    try:
        dev = os.stat(exchange.SHM_DIR).st_dev
    except OSError:
        return f"{socket.gethostname()}|{boot}|noshm{os.getpid()}"
    return f"{socket.gethostname()}|{boot}|{dev}"


class Group:
    """A process group as the checker sees it; `seq` counts its checked collectives.

    `name` is its registered name (unique, and the same on every member); `label` the name a
    user knows it by (`WORLD`, a mesh dimension, `group[0,1]`), for messages.
    """

    __slots__ = ("board", "index", "label", "members", "name", "peers", "seq", "tiers")

    def __init__(self, name: str, label: str, members: tuple[int, ...], index: int) -> None:
        self.name = name
        self.label = label
        self.members = members
        self.index = index
        self.peers = [i for i in range(len(members)) if i != index]
        self.seq = 0
        self.board: exchange.Board | None = None
        self.tiers: exchange.Tiers | None = None  # instead of `board`, across hosts


class Groups:
    """The groups and point-to-point channels one rank's checker has met, and their boards.

    `Checker` is made of this: its checks find a group's board here (`group`), `p2p` a
    channel's (`channel`), and `forget_groups` drops them all.
    """

    def __init__(
        self,
        store: Store,
        *,
        rank: int,
        session_id: str,
        hosts: Sequence[str] | None,
        generation: int,
        monitor: WaitMonitor,
    ) -> None:
        self.store = store
        self.rank = rank
        self.session_id = session_id
        self.hosts = list(hosts) if hosts is not None else None
        # names this checker's boards: a new install, and each `forget_groups`, get new ones
        self.generation = str(generation)
        self._forgotten = 0
        self.monitor = monitor  # a wait for peers' host identities is watched like any other
        self.groups: dict[str, Group | None] = {}  # by registered name
        # point-to-point channels (group, src, dst, tag): boards and message counts
        self.channels: dict[Channel, exchange.Board] = {}
        self.sent: dict[Channel, int] = {}
        self.received: dict[Channel, int] = {}
        # after an irecv from any source this rank cannot tell which message comes next
        self.p2p_blind = False
        self._boards: list[exchange.Board] = []
        self._tier_sets: list[exchange.Tiers] = []
        self._host_ids: dict[int, str] = {}

    def group(self, name: str) -> Group | None:
        """The checker's view of the group registered as `name`; None if this rank is not in it."""
        try:
            return self.groups[name]
        except KeyError:
            g = self.groups[name] = self._new_group(name)
            return g

    def _new_group(self, name: str) -> Group | None:
        pg = c10d._resolve_process_group(name)  # type: ignore[arg-type]
        if pg is None or c10d._rank_not_in_group(pg):
            return None
        members = tuple(dist.get_process_group_ranks(pg))
        if self.rank not in members:
            return None
        g = Group(name, group_label(pg, members), members, members.index(self.rank))
        if len(members) == 1:
            return g
        hosts = exchange.hosts_of(self._identities(members))
        if 1 < len(hosts) < len(members) or len(members) >= FLAT_MAX:
            g.tiers = self._tiers(name, members, hosts, g.index)
        else:
            g.board = self.board(f"c-{name}", members, len(members), 2, SLOT_SIZE)
        return g

    def _tiers(
        self, name: str, members: Sequence[int], hosts: list[list[int]], index: int
    ) -> exchange.Tiers:
        """A two-level exchange (`exchange.tiered`): a shared-memory board per host (named after
        the host's first member, since hosts rehearsed on one machine share /dev/shm), and the
        leaders' and the details' boards in the store. Each store board says whose each ring is,
        so that a slot read forged is asked again of its writer (`distnb.contract.posts`)."""
        mine = next(h for h in hosts if index in h)
        local = f"c-{name}-h{members[mine[0]]}"
        path = exchange.shm_path(self.session_id, f"{self.generation}-{local}")
        writers = [members[i] for i in mine] + [members[mine[0]]] * 2  # result, abort: leader's
        spill = exchange.StoreBoard(self.store, keys.spill(self.generation, local), 2, writers)
        board = exchange.ShmBoard(path, len(mine) + 2, 2, SLOT_SIZE, spill)
        leaders = details = None
        if len(hosts) > 1:
            heads = [members[h[0]] for h in hosts]
            spread = [head for head in heads for _ in range(exchange.rounds(len(hosts)))]
            leaders = exchange.StoreBoard(
                self.store, keys.board(self.generation, f"c-{name}-l"), 2, spread
            )
            details = exchange.StoreBoard(
                self.store, keys.board(self.generation, f"c-{name}-d"), 2, heads
            )
        tiers = exchange.Tiers(hosts, index, board, leaders, details, wire.core_bytes)
        self._tier_sets.append(tiers)
        return tiers

    # --- boards ---------------------------------------------------------------------------------

    def channel(self, key: Channel) -> exchange.Board:
        """The board of a point-to-point channel: ring 0 carries the sender's fingerprints,
        ring 1 the receiver's verdicts on mismatches (see `distnb.rank.checked.p2p`)."""
        board = self.channels.get(key)
        if board is None:
            group, src, dst, tag = key
            name = f"p-{group}-{src}-{dst}-{tag}"
            board = self.board(name, (src, dst), 2, exchange.P2P_DEPTH, P2P_SLOT_SIZE)
            self.channels[key] = board
        return board

    def board(
        self, name: str, members: Sequence[int], rings: int, depth: int, slot: int
    ) -> exchange.Board:
        if len(set(self._identities(members))) == 1:
            path = exchange.shm_path(self.session_id, f"{self.generation}-{name}")
            prefix = keys.spill(self.generation, name)
            spill = exchange.StoreBoard(self.store, prefix, depth, members)
            board: exchange.Board = exchange.ShmBoard(path, rings, depth, slot, spill)
        else:
            prefix = keys.board(self.generation, name)
            board = exchange.StoreBoard(self.store, prefix, depth, members)
        self._boards.append(board)
        return board

    def _identities(self, members: Sequence[int]) -> list[str]:
        """Each member's host, as `hosts` names it or as the member's `host_identity` says."""
        if self.hosts is not None:
            return [self.hosts[r] for r in members]
        wanted = [r for r in members if r not in self._host_ids]
        if wanted:
            names = [keys.host(r) for r in wanted]
            where = callsite.lookup()
            start = Wait(WaitKind.START, "", "(install)", 0, "install", where, wanted)
            self.monitor.start(start)
            t0 = time.monotonic_ns()
            next_tick = exchange.TICK_NS
            try:
                while not self.store.check(names):
                    # a forged identity: its rank posts it again when asked (`posts`)
                    posts.ask_again(self.store, take_forged(self.store))
                    time.sleep(0.001)
                    elapsed = time.monotonic_ns() - t0
                    if elapsed >= next_tick:
                        next_tick += exchange.TICK_NS
                        self.monitor.tick(elapsed, range(len(wanted)))
            finally:
                self.monitor.end()
            for r, value in zip(wanted, self.store.multi_get(names), strict=True):
                self._host_ids[r] = value.decode()
        return [self._host_ids[r] for r in members]

    def forget_groups(self) -> None:
        """Drop every group and channel; boards made from now on have new names."""
        self.close()
        self._forgotten += 1
        self.generation = f"{self.generation.split('.')[0]}.{self._forgotten}"
        self.sent.clear()
        self.received.clear()
        self.p2p_blind = False

    def close(self) -> None:
        for board in self._boards:
            board.close(unlink=True)
        for tiers in self._tier_sets:
            tiers.close(unlink=True)
        self._boards.clear()
        self._tier_sets.clear()
        self.channels.clear()
        self.groups.clear()


def group_label(pg: Any, members: Sequence[int]) -> str:
    """`WORLD`, a `DeviceMesh` dimension (`tp`), the `group_desc` given to `new_group`, or the
    group's ranks (`group[0,1]`): the name a user knows a group by."""
    if pg is c10d._get_default_group():
        return "WORLD"
    desc = str(getattr(pg, "group_desc", "") or "")
    if desc and desc not in ("undefined", "default_pg"):
        return desc.removeprefix("mesh_")
    return f"group[{','.join(map(str, members))}]"
