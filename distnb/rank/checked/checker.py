"""The check of one collective on one rank: post, collect, judge, then dispatch and record.

`Checker.collective` is the hot path of every checked collective:

1. describe the call (done by its op's kernel, `intercept` and `ops`), find the caller's line and
   the call's origin (`callsite`);
2. post the fingerprint for (group, seq) on the group's board and collect every member's;
3. look the members' fingerprints up in a cache of verdicts; on a miss run `distnb.judgement`;
4. on a mismatch raise `CollectiveMismatchError` (every member raises the same one, since every
   member judged the same fingerprints), else dispatch the real call and record the event.

Long waits are watched (`monitor`: beacon, abort key, deadlock check). When a wait ends without
the collective (abort key, a deadlock, Ctrl-C while a peer is still missing) the rank takes its
fingerprint back and does not count the seq, so that its next call lines up with its peers again.
The groups, channels and boards a `Checker` is made of are in `groups`.
"""

from __future__ import annotations

import contextlib
import marshal
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Store

from distnb import judgement
from distnb.contract import keys, posts
from distnb.errors import CollectiveDesyncError, CollectiveMismatchError, ConfigError
from distnb.rank.checked import callsite, exchange
from distnb.rank.checked import origin as origin_of
from distnb.rank.checked.calls import Call, Core, local
from distnb.rank.checked.groups import SHM_VAR, Group, Groups, host_identity
from distnb.rank.checked.monitor import Wait, WaitMonitor, mismatch_error
from distnb.rank.checked.origin import BACKWARD
from distnb.rank.checked.recorder import END, Recorder
from distnb.rank.checked.wire import Where, core_bytes, decode, encode, fingerprint
from distnb.records.beacon import Beacon, WaitKind
from distnb.records.collective import Fingerprint, Mismatch

# SHM_VAR (from `groups`) is imported from here by tests and benchmarks
__all__ = ["SHM_VAR", "WAIT_ENDED", "Checker", "end_when_done"]

_MAX_VERDICTS = 4096
_ScriptObject = torch.ScriptObject
# errors that end a wait without the call: the rank takes back what it posted
WAIT_ENDED = (KeyboardInterrupt, CollectiveDesyncError, CollectiveMismatchError)


class Checker(Groups):
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
        super().__init__(
            store,
            rank=rank,
            session_id=session_id,
            hosts=hosts,
            generation=generation,
            monitor=WaitMonitor(store, rank, self._blocks),
        )
        self.world_size = world_size
        self.check_finite = check_finite
        self.recorder = Recorder(ring_size)
        # (group name, graph task) of the last collective from the autograd engine, and how
        # many it made: DDP's reducer reduces its buckets in index order
        self._backward: tuple[str, int] = ("", -1)
        self._buckets = 0
        self.verdicts: dict[tuple[Any, ...], bool] = {}
        if self.hosts is None:
            identity = host_identity(rank)
            posts.post(store, keys.host(rank), identity)  # a peer that reads it forged asks again

    @property
    def run_id(self) -> int | None:
        return self.monitor.run_id

    @run_id.setter
    def run_id(self, run_id: int | None) -> None:
        self.monitor.run_id = run_id

    def post_mismatch(self, mismatch: Mismatch) -> None:
        """Post the record of the mismatch this rank raises where the kernel reads it
        (`keys.mismatch`): the error the notebook shows is built from it, with no call back."""
        with contextlib.suppress(Exception):  # a store gone must not hide the mismatch itself
            self.store.set(keys.mismatch(self.run_id), mismatch.to_json())

    # --- collectives --------------------------------------------------------------------------

    def collective(self, call: Call, dispatch: Callable[[], Any]) -> Any:
        """Check `call` with its group's other members, then run it through `dispatch()`."""
        __tracebackhide__ = True  # IPython leaves this frame out of tracebacks
        arrive = time.monotonic_ns()
        g = self.group(call.group)
        if g is None:
            return dispatch()
        site, origin = callsite.lookup()
        if origin == BACKWARD and call.op == "all_reduce":
            origin = self._bucket(g)
        finite = self._finite(call.reduce) if call.reduce and self.check_finite else None
        root = g.members[call.root] if call.root is not None else None
        core = call.core(finite, root, None)
        seq = g.seq
        g.seq = seq + 1
        interrupted = self._exchange(g, seq, core, (site, origin))
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
            origin,
        ]
        result = dispatch()
        if not call.async_op:
            # the caller (`torch.distributed`'s function) waits for the work right away: the
            # wait stamps the end (`context`), at no cost to the backend's worker thread
            local.unwaited = entry
            entry[END] = time.monotonic_ns()
        elif not end_when_done(result, entry):
            entry[END] = time.monotonic_ns()
        self.recorder.add(entry)
        if interrupted:
            raise KeyboardInterrupt
        return result

    def _bucket(self, g: Group) -> str:
        """A gradient all_reduce from the autograd engine: DDP's reducer, bucket by bucket."""
        task = (g.name, torch._C._current_graph_task_id())
        if task != self._backward:
            self._backward, self._buckets = task, 0
        index = self._buckets
        self._buckets += 1
        return origin_of.ddp_bucket(g.name, index)

    def _exchange(self, g: Group, seq: int, core: Core, where: Where) -> bool:
        """Post, collect, judge. True when Ctrl-C came after every peer had posted: the caller
        finishes the collective (peers are already in it) and then raises KeyboardInterrupt."""
        __tracebackhide__ = True  # IPython leaves this frame out of tracebacks
        mine = marshal.dumps(core, 0)
        payload = encode(mine, where)
        interrupted = False
        key: tuple[Any, ...] = (g.members, mine)
        payloads = [payload]
        if g.tiers is not None:
            every, interrupted = self._exchange_tiered(g, seq, payload, mine, (core, where))
            if every is not exchange.AGREED:
                assert isinstance(every, list)
                payloads, key = every, self._key(g, mine, [core_bytes(p) for p in every])
            else:
                payloads = [payload] * len(g.members)  # every member posted this core
        elif g.board is not None:
            stamp = seq + 1
            try:
                g.board.post(g.index, stamp, payload)
            except BaseException:  # Ctrl-C mid-post: peers must not count on this seq
                self._withdraw(g, seq)
                raise
            got, interrupted = self._collect(g, seq, stamp, core, where)
            if seq == 0:  # every member has mapped the board by now
                g.board.forget()
            theirs = [core_bytes(p) for p in got]
            theirs.insert(g.index, mine)
            key = self._key(g, mine, theirs)
            payloads = list(got)
            payloads.insert(g.index, payload)
        if self.verdicts.get(key):
            return interrupted
        mismatch = judgement.match(self._fingerprints(g, seq, payloads))
        if mismatch is not None:
            self.post_mismatch(mismatch)
            raise mismatch_error(mismatch)
        self._remember(key)
        return interrupted

    @staticmethod
    def _key(g: Group, mine: bytes, cores: list[bytes]) -> tuple[Any, ...]:
        # Equal bytes mean equal cores (marshal version 0 is canonical): the usual case
        # costs one memcmp per peer and one cached verdict.
        if all(c == mine for c in cores):
            return (g.members, mine)
        return (g.members, *cores)

    def _remember(self, key: tuple[Any, ...]) -> None:
        if len(self.verdicts) >= _MAX_VERDICTS:
            self.verdicts.clear()
        self.verdicts[key] = True

    def _exchange_tiered(
        self, g: Group, seq: int, payload: bytes, mine: bytes, call: tuple[Core, Where]
    ) -> tuple[bytes | list[bytes], bool]:
        """`_exchange` in two levels (`exchange.Tiers`): AGREED, or every member's payload."""
        __tracebackhide__ = True  # IPython leaves this frame out of tracebacks
        tiers = g.tiers
        assert tiers is not None
        stamp = seq + 1

        def legal(core: bytes) -> bool:  # the same core on every member: is that a mismatch?
            key = (g.members, core)
            if not self.verdicts.get(key):
                fps = self._fingerprints(g, seq, [payload] * len(g.members))
                if judgement.match(fps) is not None:
                    return False
                self._remember(key)
            return True

        def gather(
            board: exchange.Board, rings: Sequence[int], s: int, missing: exchange.Missing
        ) -> list[bytes] | None:
            return exchange.collect(board, rings, s, lambda t, m: self.monitor.tick(t, missing(m)))

        self.monitor.start(self._wait_of(g, seq, *call))
        try:
            got = tiers.exchange(stamp, payload, mine, legal, gather)
            if seq == 0:
                tiers.forget()
            assert got is not None
            return got, False
        except KeyboardInterrupt:
            got = tiers.settle(stamp, payload, mine, legal)
            if got is None:
                self._withdraw(g, seq)
                raise
            return got, True
        except CollectiveDesyncError:
            got = tiers.settle(stamp, payload, mine, legal)
            if got is None:
                self._withdraw(g, seq)
                raise
            return got, False
        except CollectiveMismatchError as exc:  # a deadlock: the peer withdraws as well
            self._withdraw(g, seq)
            if exc.mismatch is not None:
                self.post_mismatch(exc.mismatch)
            raise
        finally:
            self.monitor.end()

    def _wait_of(self, g: Group, seq: int, core: Core, where: Where) -> Wait:
        return Wait(
            WaitKind.COLLECTIVE,
            g.name,
            g.label,
            seq,
            core[0],
            where,
            g.members,
            lambda: fingerprint(
                (core, where), rank=self.rank, group=g.label, seq=seq, members=g.members
            ),
        )

    def _collect(
        self, g: Group, seq: int, stamp: int, core: Core, where: Where
    ) -> tuple[list[bytes], bool]:
        """Wait for every peer's fingerprint; see `_exchange` for what the bool means."""
        __tracebackhide__ = True  # IPython leaves this frame out of tracebacks
        assert g.board is not None
        wait = self._wait_of(g, seq, core, where)
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
                self.post_mismatch(mismatch)
            raise

    def wait(
        self, board: exchange.Board, rings: Sequence[int], stamp: int, wait: Wait
    ) -> list[bytes]:
        """`exchange.collect`, watched: beacon, abort key and deadlock check on long waits."""
        __tracebackhide__ = True  # IPython leaves this frame out of tracebacks
        self.monitor.start(wait)
        try:
            return exchange.collect(board, rings, stamp, self.monitor.tick)
        finally:
            self.monitor.end()

    def _withdraw(self, g: Group, seq: int) -> None:
        """Take back the fingerprint for `seq`: this rank's next call is `seq` again."""
        if g.board is not None:
            g.board.retract(g.index, seq + 1)
        if g.tiers is not None:
            g.tiers.withdraw()
        g.seq = seq

    def _blocks(self, wait: Wait, peer: Beacon) -> bool:
        """Does a peer's wait (from its beacon), which waits for this rank, need a call that
        this rank has not made, so that it cannot end while this rank waits in `wait`?"""
        if peer.kind is WaitKind.RECV:  # it waits for message `seq` from this rank
            channel = (peer.group_name, self.rank, peer.rank, peer.tag)
            return self.sent.get(channel, 0) <= peer.seq
        if peer.kind is not WaitKind.COLLECTIVE:
            return False
        g = self.groups.get(peer.group_name)
        if g is None:  # a group this rank has not used yet: it posted nothing there
            members = peer.fingerprint.group_ranks if peer.fingerprint is not None else ()
            return self.rank in members
        if wait.kind is WaitKind.COLLECTIVE and (wait.group, wait.seq) == (g.name, peer.seq):
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

    def forget_groups(self) -> None:
        """Drop every group and channel; boards made from now on have new names."""
        super().forget_groups()
        self.verdicts.clear()


def end_when_done(result: Any, entry: list[Any]) -> bool:
    """Fill in the end time when the op's work completes; False if it has no future to tell
    (a functional collective's result, gloo's point-to-point work)."""
    work = result[-1] if isinstance(result, tuple) else result
    try:
        if type(work) is _ScriptObject:
            # An op's kernel returns its work boxed (`torch.classes.c10d.Work`: DDP's buckets).
            # Asking the box for `get_future` fails, and slowly (68 us a call, measured here).
            work = dist.Work.unbox(work)
        elif not isinstance(work, dist.Work):
            return False
        fut = work.get_future()
    except RuntimeError:  # not a work after all; gloo's point-to-point work has no future
        return False
    fut.add_done_callback(lambda _: entry.__setitem__(END, time.monotonic_ns()))
    return True
