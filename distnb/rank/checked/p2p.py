"""Checked point-to-point messages: `c10d::send`/`recv_` and the functional isend/irecv, and
`batch_isend_irecv`.

Messages are counted per channel (group, src, dst, tag), the unit in which backends keep them
in order. The sender posts its fingerprint for message n on the channel and sends; it never waits
for the receiver (so `isend` stays non-blocking and valid send/recv orders keep working). The
receiver waits for fingerprint n and compares its buffer with it (`judgement.match_p2p`). On a
mismatch the receiver posts its verdict on the channel, receives the message into a scratch
tensor shaped like the sent one (so the sender's transfer completes and gloo never aborts), and
raises `CollectiveMismatchError`. A blocking `dist.send` completes only once the receiver has
posted its receive, so it then reads the verdict without waiting and raises the same error
(`sent`); an `isend` cannot (its work is returned before that), so only the receiving side raises.

Not checked: a receive from any source (`src=None`): the source is known only afterwards. A
blocking one still counts its message on the right channel (`recv_any`), but after an
`irecv(src=None)` this rank can no longer tell which message comes next, so its later receives
pass unchecked until `install` runs again. A receiver more than `exchange.P2P_DEPTH` messages
behind its sender lets the lapped messages through unchecked.
"""

from __future__ import annotations

import copy
import functools
import marshal
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from distnb import judgement
from distnb.rank.checked import callsite, exchange
from distnb.rank.checked.calls import Call, group_name, local, spec
from distnb.rank.checked.checker import WAIT_ENDED, Checker
from distnb.rank.checked.groups import Channel, Group
from distnb.rank.checked.monitor import Wait, mismatch_error
from distnb.rank.checked.wire import Where, decode, encode, fingerprint
from distnb.records.beacon import WaitKind
from distnb.records.collective import Fingerprint, Mismatch

__all__ = ["P2P", "Sends"]


class Sends(threading.local):
    # the channel and number of the last message this thread posted (for `dist.send`'s verdict)
    last: tuple[Channel, int] | None = None
    # inside a blocking `dist.recv(src=None)`: the receive is counted once its source is known
    any_source = False


class P2P:
    """Point-to-point checks of one checker; `op` is the kernel's entry, the rest wrap Python."""

    def __init__(self, checker: Checker) -> None:
        self.checker = checker
        self.sends = Sends()

    def op(self, call: Call, dispatch: Callable[[], Any]) -> Any:
        """A checked send or receive op (`intercept`'s kernel hands them here)."""
        __tracebackhide__ = True  # IPython leaves this frame out of tracebacks
        c = self.checker
        g = c.group(call.group)
        if call.op == "recv_any":
            if not self.sends.any_source:
                c.p2p_blind = True  # an irecv from any source: later receives cannot line up
            return dispatch()
        if g is None or call.peer is None or (c.p2p_blind and call.op == "recv"):
            return dispatch()
        arrive = time.monotonic_ns()
        where = callsite.lookup()
        peer = g.members[call.peer]
        if call.op == "send":
            key, n = self._post_send(g, call, peer, where)
            self.sends.last = (key, n)
            start = time.monotonic_ns()
            result = dispatch()
            self._record(call, key, n, where, arrive, start)
            return result
        key, n, mismatch = self._check_recv(g, call, peer, where)
        start = time.monotonic_ns()
        if mismatch is not None:
            self._drain(mismatch, call, peer)
            raise mismatch_error(mismatch)
        result = dispatch()
        self._record(call, key, n, where, arrive, start)
        return result

    # --- Python-level wrappers (see `context`) ----------------------------------------------

    def send(self, fn: Any) -> Any:
        """`dist.send`: once the message is through, raise the receiver's verdict if it had one."""

        @functools.wraps(fn)
        def send(*args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True  # IPython leaves this frame out of tracebacks
            self.sends.last = None
            result = fn(*args, **kwargs)
            last, self.sends.last = self.sends.last, None
            verdict = self._verdict(*last) if last is not None else None
            if verdict is not None:
                raise mismatch_error(verdict)
            return result

        return send

    def recv(self, fn: Any) -> Any:
        """`dist.recv`: a receive from any source counts its message once the source is known."""

        @functools.wraps(fn)
        def recv(tensor: Any, src: Any = None, group: Any = None, tag: int = 0, **kw: Any) -> Any:
            __tracebackhide__ = True  # IPython leaves this frame out of tracebacks
            if src is not None or kw.get("group_src") is not None:
                return fn(tensor, src, group, tag, **kw)
            self.sends.any_source = True
            try:
                source = fn(tensor, src, group, tag, **kw)
            finally:
                self.sends.any_source = False
            g = self.checker.group(group_name(group))
            if g is not None and isinstance(source, int) and source >= 0:
                key = (g.name, source, self.checker.rank, int(tag))
                self.checker.received[key] = self.checker.received.get(key, 0) + 1
            return source

        return recv

    def batch(self, fn: Any) -> Any:
        """`batch_isend_irecv`: every send is posted before any receive waits, since each rank
        may list its sends and receives in any order; then the batch runs unchecked below."""

        @functools.wraps(fn)
        def batch(op_list: Any) -> Any:
            __tracebackhide__ = True  # IPython leaves this frame out of tracebacks
            calls = [_describe(op) for op in op_list] if isinstance(op_list, list) else []
            if not calls or any(c is None for c in calls) or self.checker.p2p_blind:
                return fn(op_list)
            return self._batch(fn, op_list, [c for c in calls if c is not None])

        return batch

    def _batch(self, fn: Any, op_list: list[Any], calls: list[Call]) -> Any:
        c = self.checker
        g = c.group(calls[0].group)
        if g is None:
            return fn(op_list)
        arrive = time.monotonic_ns()
        where = callsite.lookup()
        posted: list[tuple[Channel, int]] = []
        checked: list[tuple[Channel, int]] = []
        done: list[tuple[Call, Channel, int]] = []
        mismatches: list[Mismatch] = []
        ops_out = list(op_list)
        try:
            for call in calls:
                if call.op == "send" and call.peer is not None:
                    posted.append(self._post_send(g, call, g.members[call.peer], where))
                    done.append((call, *posted[-1]))
            for i, call in enumerate(calls):
                if call.op == "recv" and call.peer is not None:
                    key, n, mismatch = self._check_recv(g, call, g.members[call.peer], where)
                    checked.append((key, n))
                    done.append((call, key, n))
                    if mismatch is not None:
                        mismatches.append(mismatch)
                        ops_out[i] = copy.copy(op_list[i])
                        ops_out[i].tensor = _scratch(mismatch, call)
        except WAIT_ENDED:
            for key, n in posted:
                c.channel(key).retract(0, n + 1)
                c.sent[key] = n
            for key, n in checked:
                c.received[key] = n
            raise
        start = time.monotonic_ns()
        local.depth += 1  # the batch's own ops pass unchecked: they were checked above
        try:
            works = fn(ops_out)
        finally:
            local.depth -= 1
        for call, key, n in done:
            self._record(call, key, n, where, arrive, start)
        if mismatches:
            for work in works:
                work.wait()
            raise mismatch_error(mismatches[0])
        return works

    # --- channels ---------------------------------------------------------------------------

    def _post_send(self, g: Group, call: Call, peer: int, where: Where) -> tuple[Channel, int]:
        """Post a send's fingerprint on its channel: (channel, message number)."""
        c = self.checker
        key = (g.name, c.rank, peer, call.tag)
        n = c.sent.get(key, 0)
        c.sent[key] = n + 1
        core = call.core(None, None, peer)
        c.channel(key).post(0, n + 1, encode(marshal.dumps(core, 0), where))
        return key, n

    def _verdict(self, key: Channel, n: int) -> Mismatch | None:
        """The receiver's verdict on message n, if it found a mismatch (it posts only those)."""
        data = self.checker.channel(key).read(1, n + 1)
        return Mismatch.from_json(data) if data else None

    def _check_recv(
        self, g: Group, call: Call, peer: int, where: Where
    ) -> tuple[Channel, int, Mismatch | None]:
        """Wait for the sender's fingerprint of the next message and judge the receive buffer.

        Returns (channel, message number, mismatch or None); None also when the sender lapped us.
        """
        __tracebackhide__ = True  # IPython leaves this frame out of tracebacks
        c = self.checker
        key = (g.name, peer, c.rank, call.tag)
        n = c.received.get(key, 0)
        c.received[key] = n + 1
        board = c.channel(key)
        core = call.core(None, None, peer)

        def mine() -> Fingerprint:
            return fingerprint((core, where), rank=c.rank, group=g.label, seq=n, members=())

        wait = Wait(
            WaitKind.RECV, g.name, g.label, n, call.op, where, (peer,), mine, peer, call.tag
        )
        try:
            (data,) = c.wait(board, [0], n + 1, wait)
        except WAIT_ENDED:
            c.received[key] = n
            raise
        if n == 0:  # the sender mapped the channel's board to post this: both have it now
            board.forget()
        if data == exchange.LAPPED:
            return key, n, None
        sent = fingerprint(decode(data), rank=peer, group=g.label, seq=n, members=())
        mismatch = judgement.match_p2p(sent, mine())
        if mismatch is not None:
            board.post(1, n + 1, mismatch.to_json().encode())
            c.post_mismatch(mismatch)
        return key, n, mismatch

    def _drain(self, mismatch: Mismatch, call: Call, peer: int) -> None:
        """Receive the mismatched message into scratch, so that its sender is not left hanging."""
        scratch = _scratch(mismatch, call)
        group = dist.distributed_c10d._resolve_process_group(call.group)  # type: ignore[arg-type]
        local.depth += 1
        try:
            dist.recv(scratch, src=peer, group=group, tag=call.tag)
        finally:
            local.depth -= 1

    def _record(
        self, call: Call, key: Channel, n: int, where: Where, arrive: int, start: int
    ) -> None:
        # The timeline pairs a message's two events by (group, seq): name the channel.
        c = self.checker
        g = c.group(key[0])
        _, src, dst, tag = key
        label = f"{g.label if g else key[0]} {src}->{dst}" + (f" tag {tag}" if tag else "")
        site, origin = where
        # the end of point-to-point work is not known here (gloo's has no future)
        c.recorder.add(
            [c.rank, label, n, call.op, call.nbytes, site, arrive, start, 0, c.run_id, 2, origin]
        )


def _scratch(mismatch: Mismatch, call: Call) -> torch.Tensor:
    """A buffer shaped like the tensor actually sent, on this rank's device type."""
    sent = next(f for f in mismatch.fingerprints if judgement.canonical_op(f.op) == "send")
    sent_spec = sent.inputs[0]
    device = call.outputs[0][2] if call.outputs else "cpu"
    return torch.empty(sent_spec.shape, dtype=getattr(torch, sent_spec.dtype), device=device)


def _describe(op: Any) -> Call | None:
    """A `P2POp` as a `Call` (peer as a group rank, like the ops take it)."""
    name = getattr(op.op, "__name__", "")
    if name not in ("isend", "irecv"):
        return None
    try:
        group = group_name(op.group)
        peer = getattr(op, "group_peer", None)
        if peer is None:
            peer = dist.get_group_rank(op.group, op.peer) if op.group is not None else op.peer
        specs = (spec(op.tensor),)
        kind = "send" if name == "isend" else "recv"
        inputs, outputs = (specs, ()) if kind == "send" else ((), specs)
        return Call(kind, group, inputs, outputs, peer=peer, tag=op.tag, nbytes=op.tensor.nbytes)
    except Exception:
        return None
