"""Checked point-to-point messages: send/recv/isend/irecv and `batch_isend_irecv`.

Messages are counted per channel (group, src, dst, tag), the unit in which backends keep them
in order. The sender posts its fingerprint for message n on the channel and sends; it never waits
for the receiver (so `isend` stays non-blocking and valid send/recv orders keep working). The
receiver waits for fingerprint n and compares its buffer with it (`matching.match_p2p`). On a
mismatch the receiver posts its verdict on the channel, receives the message into a scratch
tensor shaped like the sent one (so the sender's transfer completes and gloo never aborts), and
raises `CollectiveMismatchError`. A blocking `send` completes only once the receiver has posted
its recv, so it then reads the verdict without waiting and raises the same error; an `isend`
cannot (its work is returned before that), so only the receiving side raises.

Not checked: a recv from any source (`src=None`): the source is known only afterwards; a blocking
one still counts its message on the right channel, but after an `irecv(src=None)` this rank can
no longer tell which message comes next, so its later receives pass unchecked until `install`
runs again. A receiver more than `exchange.P2P_DEPTH` messages behind its sender lets the lapped
messages through unchecked.
"""

from __future__ import annotations

import copy
import marshal
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from distnb import matching
from distnb.rank.checked import callsite, exchange, ops
from distnb.rank.checked.checker import WAIT_ENDED, Channel, Checker, Group, dispatch
from distnb.rank.checked.monitor import Wait, mismatch_error
from distnb.rank.checked.wire import decode, encode, fingerprint
from distnb.records.beacon import WaitKind
from distnb.records.collective import Fingerprint, Mismatch

__all__ = ["batch", "p2p", "recv_anysource"]


def p2p(
    checker: Checker, original: Callable[..., Any], call: ops.Call, args: Any, kwargs: Any
) -> Any:
    """A checked send, isend, recv or irecv."""
    arrive = time.monotonic_ns()
    g = checker.group(call.group)
    is_send = call.op in ("send", "isend")
    if g is None or (checker.p2p_blind and not is_send):
        return dispatch(original, args, kwargs)
    site = callsite.lookup()
    if is_send:
        key, n = post_send(checker, g, call, site)
        start = time.monotonic_ns()
        result = dispatch(original, args, kwargs)
        _record(checker, call, key, n, site, arrive, start)
        verdict = sent_verdict(checker, key, n) if call.op == "send" else None
        if verdict is not None:
            raise mismatch_error(verdict)
        return result
    key, n, mismatch = check_recv(checker, g, call, site)
    start = time.monotonic_ns()
    if mismatch is not None:
        _drain(mismatch, call)
        raise mismatch_error(mismatch)
    result = dispatch(original, args, kwargs)
    _record(checker, call, key, n, site, arrive, start)
    return result


def recv_anysource(
    checker: Checker, original: Callable[..., Any], args: Any, kwargs: Any, name: str
) -> Any:
    """A recv or irecv from any source: unchecked; keep the channel counts right if possible."""
    result = dispatch(original, args, kwargs)
    if name == "irecv":
        checker.p2p_blind = True
    elif isinstance(result, int):
        group, tag = _group_and_tag(args, kwargs)
        g = checker.group(group)
        if g is not None and result >= 0:
            key = (g.label, result, checker.rank, tag)
            checker.received[key] = checker.received.get(key, 0) + 1
    return result


def batch(checker: Checker, original: Callable[..., Any], op_list: Any) -> Any:
    """A checked `batch_isend_irecv`: post every send, then check every recv, then dispatch."""
    if not isinstance(op_list, list) or not op_list or checker.p2p_blind:
        return dispatch(original, (op_list,), {})
    arrive = time.monotonic_ns()
    site = callsite.lookup()
    calls = [_describe(op) for op in op_list]
    g = checker.group(op_list[0].group)
    if g is None or any(c is None for c in calls):
        return dispatch(original, (_normalise(op_list),), {})
    posted: list[tuple[Channel, int]] = []
    checked: list[tuple[Channel, int]] = []
    done: list[tuple[ops.Call, Channel, int]] = []
    mismatches: list[Mismatch] = []
    ops_out = []
    try:
        for call in calls:
            assert call is not None
            if call.op == "isend":
                posted.append(post_send(checker, g, call, site))
                done.append((call, *posted[-1]))
        for op, call in zip(op_list, calls, strict=True):
            assert call is not None
            if call.op == "irecv":
                key, n, mismatch = check_recv(checker, g, call, site)
                checked.append((key, n))
                done.append((call, key, n))
                if mismatch is not None:
                    mismatches.append(mismatch)
                    op = copy.copy(op)
                    op.tensor = _scratch(mismatch, call)
            ops_out.append(op)
    except WAIT_ENDED:
        for key, n in posted:
            checker.channel(key).retract(0, n + 1)
            checker.sent[key] = n
        for key, n in checked:
            checker.received[key] = n
        raise
    start = time.monotonic_ns()
    works = dispatch(original, (_normalise(ops_out),), {})
    for call, key, n in done:
        _record(checker, call, key, n, site, arrive, start)
    if mismatches:
        for work in works:
            work.wait()
        raise mismatch_error(mismatches[0])
    return works


# --- channels ---------------------------------------------------------------------------------


def post_send(
    checker: Checker, g: Group, call: ops.Call, site: callsite.Site
) -> tuple[Channel, int]:
    """Post a send's fingerprint on its channel: (channel, message number)."""
    assert call.peer is not None
    key = (g.label, checker.rank, call.peer, call.tag)
    n = checker.sent.get(key, 0)
    checker.sent[key] = n + 1
    checker.channel(key).post(0, n + 1, encode(marshal.dumps(call.core(None), 0), site))
    return key, n


def sent_verdict(checker: Checker, key: Channel, n: int) -> Mismatch | None:
    """The receiver's verdict on message n, if it found a mismatch (it posts only those)."""
    data = checker.channel(key).read(1, n + 1)
    return Mismatch.from_json(data) if data else None


def check_recv(
    checker: Checker, g: Group, call: ops.Call, site: callsite.Site
) -> tuple[Channel, int, Mismatch | None]:
    """Wait for the sender's fingerprint of the next message and judge the receive buffer.

    Returns (channel, message number, mismatch or None); None also when the sender lapped us.
    """
    assert call.peer is not None
    key = (g.label, call.peer, checker.rank, call.tag)
    n = checker.received.get(key, 0)
    checker.received[key] = n + 1
    board = checker.channel(key)
    core = call.core(None)

    def mine() -> Fingerprint:
        return fingerprint((core, site), rank=checker.rank, group=g.label, seq=n, members=())

    wait = Wait(WaitKind.RECV, g.label, n, call.op, site, (call.peer,), mine, call.peer, call.tag)
    try:
        (data,) = checker.wait(board, [0], n + 1, wait)
    except WAIT_ENDED:
        checker.received[key] = n
        raise
    if n == 0:  # the sender mapped the channel's board to post this: both have it now
        board.forget()
    if data == exchange.LAPPED:
        return key, n, None
    sent = fingerprint(decode(data), rank=call.peer, group=g.label, seq=n, members=())
    mismatch = matching.match_p2p(sent, mine())
    if mismatch is not None:
        board.post(1, n + 1, mismatch.to_json().encode())
        checker.last_mismatch = mismatch
    return key, n, mismatch


# --- helpers ----------------------------------------------------------------------------------


def _scratch(mismatch: Mismatch, call: ops.Call) -> torch.Tensor:
    """A buffer shaped like the tensor actually sent, on this rank's device type."""
    sent = next(f for f in mismatch.fingerprints if matching.canonical_op(f.op) == "send")
    spec = sent.inputs[0]
    device = call.outputs[0][2] if call.outputs else "cpu"
    return torch.empty(spec.shape, dtype=getattr(torch, spec.dtype), device=device)


def _drain(mismatch: Mismatch, call: ops.Call) -> None:
    """Receive the mismatched message into scratch, so that its sender is not left hanging."""
    scratch = _scratch(mismatch, call)
    dispatch(dist.recv, (scratch,), {"src": call.peer, "group": call.group, "tag": call.tag})


def _describe(op: Any) -> ops.Call | None:
    name = getattr(op.op, "__name__", "")
    if name not in ("isend", "irecv"):
        return None
    try:
        return ops.DESCRIBERS[name](op.tensor, op.peer, op.group, op.tag)
    except Exception:
        return None


def _normalise(op_list: Sequence[Any]) -> list[Any]:
    """Point each op at the module's current isend/irecv: torch's batch_isend_irecv tells them
    apart by identity (`op.op is isend`), which a P2POp made before `install` would fail."""
    out = []
    for op in op_list:
        current = getattr(c10d, getattr(op.op, "__name__", ""), None)
        if current is not None and op.op is not current:
            op = copy.copy(op)
            op.op = current
        out.append(op)
    return out


def _group_and_tag(args: Any, kwargs: Any) -> tuple[Any, int]:
    # recv(tensor, src=None, group=None, tag=0, group_src=None)
    group = kwargs.get("group", args[2] if len(args) > 2 else None)
    tag = kwargs.get("tag", args[3] if len(args) > 3 else 0)
    return group, int(tag)


def _record(
    checker: Checker,
    call: ops.Call,
    key: Channel,
    n: int,
    site: callsite.Site,
    arrive: int,
    start: int,
) -> None:
    # The timeline pairs a message's two events by (group, seq): name the channel, not the group.
    label, src, dst, tag = key
    group = f"{label} {src}->{dst}" + (f" tag {tag}" if tag else "")
    # async p2p work on gloo has no future: its end stays unknown (0)
    end = 0 if call.op in ("isend", "irecv") else time.monotonic_ns()
    checker.recorder.add(
        [checker.rank, group, n, call.op, call.nbytes, site, arrive, start, end, checker.run_id, 2]
    )
