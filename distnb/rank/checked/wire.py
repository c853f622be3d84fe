"""The wire form of a fingerprint: what one rank posts for its peers, and reading it back.

A payload is `F`, the core's length, the core, then the call site and origin. The **core** (op,
tensor specs, reduce op, root, peer, split sizes, count, finiteness, tag, a DDP model's
parameters) is a plain tuple
marshalled with version 0, which is canonical: equal cores are equal bytes, so the usual check
(every rank made the same call) is one `memcmp` per peer. The call site rides along for messages
and may differ between ranks (`if rank == 0: ... else: ...`), as may the origin.
"""

from __future__ import annotations

import marshal
import struct
from typing import Any

from distnb.rank.checked import callsite
from distnb.rank.checked.calls import Core
from distnb.rank.checked.monitor import to_callsite
from distnb.records.collective import Fingerprint, Param, TensorSpec

__all__ = ["Where", "core_bytes", "decode", "encode", "fingerprint"]

_LEN = struct.Struct("<I")


# (call site, origin): where the call was made, and the library code it came through
Where = tuple[callsite.Site, str]


def encode(core: bytes, where: Where) -> bytes:
    """Tag, core length, core (marshal version 0, canonical), call site and origin."""
    return b"F" + _LEN.pack(len(core)) + core + marshal.dumps(where, 0)


def core_bytes(payload: bytes) -> bytes:
    n: int = _LEN.unpack_from(payload, 1)[0]
    return payload[5 : 5 + n]


def decode(payload: bytes) -> tuple[Core, Where]:
    n: int = _LEN.unpack_from(payload, 1)[0]
    return marshal.loads(payload[5 : 5 + n]), marshal.loads(payload[5 + n :])


def fingerprint(
    payload: tuple[Core, Where], *, rank: int, group: str, seq: int, members: Any
) -> Fingerprint:
    """A record from the compact form that travels between ranks."""
    core, (site, origin) = payload
    op, ins, outs, reduce_op, root, peer, in_splits, out_splits, count, finite, tag, params = core
    return Fingerprint(
        rank=rank,
        group=group,
        seq=seq,
        op=op,
        inputs=tuple(_spec(s) for s in ins),
        outputs=tuple(_spec(s) for s in outs),
        reduce_op=reduce_op,
        root=root,
        peer=peer,
        in_splits=in_splits,
        out_splits=out_splits,
        count=count,
        finite=finite,
        tag=tag,
        group_ranks=tuple(members),
        site=to_callsite(site),
        origin=origin,
        params=tuple(Param(name, _spec(p)) for name, p in params),
    )


def _spec(s: Any) -> TensorSpec:
    shape, dtype, device = s
    return TensorSpec(tuple(shape), dtype, device)
