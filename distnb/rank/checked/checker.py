"""The checked runtime's per-rank state: groups, boards, the check itself, events.

`Checker.collective` is the hot path of every checked collective:

1. describe the call (done by the wrapper, `distnb.rank.checked.ops`), find the caller's line;
2. post the fingerprint for (group, seq) on the group's board and collect every member's;
3. look the members' fingerprints up in a cache of verdicts; on a miss run `distnb.matching`;
4. on a mismatch raise `CollectiveMismatchError` (every member raises the same one, since every
   member judged the same fingerprints), else dispatch the real call and record the event.

Long waits are watched (`distnb.rank.checked.monitor`: beacon, abort key, deadlock check). When a wait
ends without the collective (abort key, a deadlock, Ctrl-C while a peer is still missing) the
rank takes its fingerprint back and does not count the seq, so that its next call lines up with
its peers again.
"""

from __future__ import annotations

import marshal
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Store
from torch.distributed import distributed_c10d as c10d

from distnb import keys, matching
from distnb.errors import CollectiveDesyncError, CollectiveMismatchError, ConfigError
from distnb.rank.checked import callsite, exchange
from distnb.rank.checked.monitor import Wait, WaitMonitor, mismatch_error
from distnb.rank.checked.ops import Call, Core
from distnb.rank.checked.recorder import END, Recorder
from distnb.rank.checked.wire import core_bytes, decode, encode, fingerprint
from distnb.records.beacon import Beacon, WaitKind
from distnb.records.collective import Fingerprint, Mismatch

__all__ = ["Channel", "Checker", "Group", "dispatch", "end_when_done", "host_identity", "local"]

SLOT_SIZE = 16 * 1024  # one fingerprint; bigger ones spill into the store
P2P_SLOT_SIZE = 2 * 1024
_MAX_VERDICTS = 4096
_NOT_CACHED = object()
# errors that end a wait without the call: the rank takes back what it posted
WAIT_ENDED = (KeyboardInterrupt, CollectiveDesyncError, CollectiveMismatchError)

Channel = tuple[str, int, int, int]  # (group label, src, dst, tag), global ranks


def host_identity() -> str:
    """Ranks with equal identities can share /dev/shm: same host, boot and tmpfs mount."""
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
    """A process group as the checker sees it; `seq` counts its checked collectives."""

    __slots__ = ("board", "index", "label", "members", "peers", "seq")

    def __init__(self, label: str, members: tuple[int, ...], index: int) -> None:
        self.label = label
        self.members = members
        self.index = index
        self.peers = [i for i in range(len(members)) if i != index]
        self.seq = 0
        self.board: exchange.Board | None = None


class Checker:
    """Everything the checked runtime keeps on one rank between `install` and `uninstall`."""

    def __init__(
        self,
        store: Store,
        *,
        rank: int,
        world_size: int,
        session_id: str,
        hosts: Sequence[str] | None,
        check_finite: bool,
        ring_size: int,
        generation: int,
    ) -> None:
        if hosts is not None and len(hosts) != world_size:
            raise ConfigError(f"hosts names {len(hosts)} ranks; world_size is {world_size}")
        if not 0 <= rank < world_size:
            raise ConfigError(f"rank must be in 0..{world_size - 1}, got {rank}")
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.session_id = session_id
        self.hosts = list(hosts) if hosts is not None else None
        self.check_finite = check_finite
        self.recorder = Recorder(ring_size)
        self.generation = generation
        self.monitor = WaitMonitor(store, rank, self._blocks)
        self.last_mismatch: Mismatch | None = None
        self.groups: dict[Any, Group | None] = {}
        self.by_label: dict[str, Group] = {}
        # point-to-point channels (group, src, dst, tag): boards and message counts
        self.channels: dict[Channel, exchange.Board] = {}
        self.sent: dict[Channel, int] = {}
        self.received: dict[Channel, int] = {}
        # after an irecv from any source this rank cannot tell which message comes next
        self.p2p_blind = False
        self.verdicts: dict[tuple[Any, ...], bool] = {}
        self._boards: list[exchange.Board] = []
        self._host_ids: dict[int, str] = {}
        if self.hosts is None:
            store.set(keys.host(rank), host_identity())

    @property
    def run_id(self) -> int | None:
        return self.monitor.run_id

    @run_id.setter
    def run_id(self, run_id: int | None) -> None:
        self.monitor.run_id = run_id

    # --- collectives --------------------------------------------------------------------------

    def collective(self, original: Callable[..., Any], call: Call, args: Any, kwargs: Any) -> Any:
        arrive = time.monotonic_ns()
        g = self.group(call.group)
        if g is None:
            return original(*args, **kwargs)
        site = callsite.lookup()
        finite = self._finite(call.reduce) if call.reduce and self.check_finite else None
        core = call.core(finite)
        seq = g.seq
        g.seq = seq + 1
        interrupted = self._exchange(g, seq, core, site)
        start = time.monotonic_ns()
        entry = [
            self.rank,
            g.label,
            seq,
            call.op,
            call.nbytes,
            site,
            arrive,
            start,
            0,
            self.monitor.run_id,
            len(g.members),
        ]
        result = dispatch(original, args, kwargs)
        if call.async_op and result is not None:
            end_when_done(result, entry)
        else:
            entry[END] = time.monotonic_ns()
        self.recorder.add(entry)
        if interrupted:
            raise KeyboardInterrupt
        return result

    def group(self, pg: Any) -> Group | None:
        """The checker's view of `pg` (None: the default group); None if this rank is not in it."""
        g = self.groups.get(pg, _NOT_CACHED)
        if g is _NOT_CACHED:
            g = self.groups[pg] = self._new_group(pg)
        return g  # type: ignore[return-value]

    def _new_group(self, pg: Any) -> Group | None:
        default = c10d._get_default_group()
        real = default if pg is None else pg
        if real is c10d.GroupMember.NON_GROUP_MEMBER or c10d._rank_not_in_group(real):
            return None
        members = tuple(dist.get_process_group_ranks(real))
        if self.rank not in members:
            return None
        label = "WORLD" if real is default else f"g{real.group_name}"
        g = self.by_label.get(label)
        if g is None:
            g = self.by_label[label] = Group(label, members, members.index(self.rank))
            if len(members) > 1:
                g.board = self.board(f"c-{label}", members, len(members), 2, SLOT_SIZE)
        return g

    def _exchange(self, g: Group, seq: int, core: Core, site: callsite.Site) -> bool:
        """Post, collect, judge. True when Ctrl-C came after every peer had posted: the caller
        finishes the collective (peers are already in it) and then raises KeyboardInterrupt."""
        mine = marshal.dumps(core, 0)
        payload = encode(mine, site)
        interrupted = False
        if g.board is None:
            payloads = [payload]
            key: tuple[Any, ...] = (g.members, mine)
        else:
            stamp = seq + 1
            try:
                g.board.post(g.index, stamp, payload)
            except BaseException:  # Ctrl-C mid-post: peers must not count on this seq
                self._withdraw(g, seq)
                raise
            got, interrupted = self._collect(g, seq, stamp, core, site)
            if seq == 0:  # every member has mapped the board by now
                g.board.forget()
            theirs = [core_bytes(p) for p in got]
            # Equal bytes mean equal cores (marshal version 0 is canonical): the usual case
            # costs one memcmp per peer and one cached verdict.
            if all(c == mine for c in theirs):
                key = (g.members, mine)
            else:
                theirs.insert(g.index, mine)
                key = (g.members, *theirs)
            payloads = list(got)
            payloads.insert(g.index, payload)
        if self.verdicts.get(key):
            return interrupted
        mismatch = matching.match(self._fingerprints(g, seq, payloads))
        if mismatch is not None:
            self.last_mismatch = mismatch
            raise mismatch_error(mismatch)
        if len(self.verdicts) >= _MAX_VERDICTS:
            self.verdicts.clear()
        self.verdicts[key] = True
        return interrupted

    def _collect(
        self, g: Group, seq: int, stamp: int, core: Core, site: callsite.Site
    ) -> tuple[list[bytes], bool]:
        """Wait for every peer's fingerprint; see `_exchange` for what the bool means."""
        assert g.board is not None
        wait = Wait(
            WaitKind.COLLECTIVE,
            g.label,
            seq,
            core[0],
            site,
            g.members,
            lambda: fingerprint(
                (core, site), rank=self.rank, group=g.label, seq=seq, members=g.members
            ),
        )
        try:
            return self.wait(g.board, g.peers, stamp, wait), False
        except KeyboardInterrupt:
            got = exchange.poll_once(g.board, g.peers, stamp)
            if got is None:
                self._withdraw(g, seq)
                raise
            return got, True
        except (CollectiveDesyncError, CollectiveMismatchError) as exc:
            self._withdraw(g, seq)
            mismatch = getattr(exc, "mismatch", None)
            if mismatch is not None:
                self.last_mismatch = mismatch
            raise

    def wait(
        self, board: exchange.Board, rings: Sequence[int], stamp: int, wait: Wait
    ) -> list[bytes]:
        """`exchange.collect`, watched: beacon, abort key and deadlock check on long waits."""
        self.monitor.start(wait)
        try:
            return exchange.collect(board, rings, stamp, self.monitor.tick)
        finally:
            self.monitor.end()

    def _withdraw(self, g: Group, seq: int) -> None:
        """Take back the fingerprint for `seq`: this rank's next call is `seq` again."""
        if g.board is not None:
            g.board.retract(g.index, seq + 1)
        g.seq = seq

    def _blocks(self, wait: Wait, peer: Beacon) -> bool:
        """Does a peer's wait (from its beacon), which waits for this rank, need a call that
        this rank has not made, so that it cannot end while this rank waits in `wait`?"""
        if peer.kind is WaitKind.RECV:  # it waits for message `seq` from this rank
            channel = (peer.group, self.rank, peer.rank, peer.tag)
            return self.sent.get(channel, 0) <= peer.seq
        if peer.kind is not WaitKind.COLLECTIVE:
            return False
        g = self.by_label.get(peer.group)
        if g is None:  # a group this rank has not used yet: it posted nothing there
            members = peer.fingerprint.group_ranks if peer.fingerprint is not None else ()
            return self.rank in members
        if wait.kind is WaitKind.COLLECTIVE and (wait.label, wait.seq) == (g.label, peer.seq):
            return False  # the same collective: both wait for someone else
        return g.seq <= peer.seq  # this rank has not posted that seq yet

    def _fingerprints(self, g: Group, seq: int, payloads: Sequence[bytes]) -> list[Fingerprint]:
        return [
            fingerprint(decode(p), rank=r, group=g.label, seq=seq, members=g.members)
            for r, p in zip(g.members, payloads, strict=True)
        ]

    @staticmethod
    def _finite(tensors: Sequence[torch.Tensor]) -> bool:
        # One pass over the data per tensor, and one host sync: the documented cost of the mode.
        for t in tensors:
            if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all()):
                return False
        return True

    # --- boards ---------------------------------------------------------------------------------

    def channel(self, key: Channel) -> exchange.Board:
        """The board of a point-to-point channel: ring 0 carries the sender's fingerprints,
        ring 1 the receiver's verdicts on mismatches (see `distnb.rank.checked.p2p`)."""
        board = self.channels.get(key)
        if board is None:
            label, src, dst, tag = key
            name = f"p-{label}-{src}-{dst}-{tag}"
            board = self.board(name, (src, dst), 2, exchange.P2P_DEPTH, P2P_SLOT_SIZE)
            self.channels[key] = board
        return board

    def board(
        self, name: str, members: Sequence[int], rings: int, depth: int, slot: int
    ) -> exchange.Board:
        prefix = f"{self.generation}/{name}"
        if self._same_host(members):
            path = exchange.shm_path(self.session_id, f"{self.generation}-{name}")
            spill = exchange.StoreBoard(self.store, keys.spill(self.generation, name), depth)
            board: exchange.Board = exchange.ShmBoard(path, rings, depth, slot, spill)
        else:
            board = exchange.StoreBoard(self.store, keys.board(self.generation, name), depth)
        self._boards.append(board)
        return board

    def _same_host(self, members: Sequence[int]) -> bool:
        if self.hosts is not None:
            return len({self.hosts[r] for r in members}) == 1
        wanted = [r for r in members if r not in self._host_ids]
        if wanted:
            names = [keys.host(r) for r in wanted]
            self.monitor.start(
                Wait(WaitKind.START, "(install)", 0, "install", callsite.lookup(), wanted)
            )
            t0 = time.monotonic_ns()
            next_tick = exchange.TICK_NS
            try:
                while not self.store.check(names):
                    time.sleep(0.001)
                    elapsed = time.monotonic_ns() - t0
                    if elapsed >= next_tick:
                        next_tick += exchange.TICK_NS
                        self.monitor.tick(elapsed, range(len(wanted)))
            finally:
                self.monitor.end()
            for r, value in zip(wanted, self.store.multi_get(names), strict=True):
                self._host_ids[r] = value.decode()
        return len({self._host_ids[r] for r in members}) == 1

    def close(self) -> None:
        for board in self._boards:
            board.close(unlink=True)
        self._boards.clear()
        self.channels.clear()
        self.groups.clear()
        self.by_label.clear()


# --- dispatch ---------------------------------------------------------------------------------


class _Local(threading.local):
    # > 0 while this thread is inside a checked call (torch's own nested calls pass through) or
    # inside `unchecked()`
    depth = 0


local = _Local()


def dispatch(original: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """Run the real torch function; calls it makes in turn are not checked again."""
    local.depth += 1
    try:
        return original(*args, **kwargs)
    finally:
        local.depth -= 1


def end_when_done(work: Any, entry: list[Any]) -> None:
    """Fill in an async op's end time when its work completes (gloo p2p work has no future)."""
    try:
        fut = work.get_future()
    except (RuntimeError, AttributeError):
        return
    fut.add_done_callback(lambda _: entry.__setitem__(END, time.monotonic_ns()))
