"""The wire form of a fingerprint: what one rank posts for its peers, and reading it back.

A payload is `F`, the core's length, the core, then the call site. The **core** (op, tensor
specs, reduce op, root, peer, split sizes, count, finiteness, tag, origin) is a plain tuple
marshalled with version 0, which is canonical: equal cores are equal bytes, so the usual check
(every rank made the same call) is one `memcmp` per peer. The call site rides along for messages
and may differ between ranks (`if rank == 0: ... else: ...`).
"""

from __future__ import annotations

import marshal
import struct
from typing import Any

from distnb.rank.checked import callsite
from distnb.rank.checked.monitor import to_callsite
from distnb.rank.checked.ops import Core
from distnb.records.collective import Fingerprint, TensorSpec

__all__ = ["core_bytes", "decode", "encode", "fingerprint"]

_LEN = struct.Struct("<I")


def encode(core: bytes, site: callsite.Site) -> bytes:
    """Tag, core length, core (marshal version 0, canonical), call site."""
    return b"F" + _LEN.pack(len(core)) + core + marshal.dumps(site, 0)


def core_bytes(payload: bytes) -> bytes:
    n: int = _LEN.unpack_from(payload, 1)[0]
    return payload[5 : 5 + n]


def decode(payload: bytes) -> tuple[Core, callsite.Site]:
    n: int = _LEN.unpack_from(payload, 1)[0]
    return marshal.loads(payload[5 : 5 + n]), marshal.loads(payload[5 + n :])


def fingerprint(
    payload: tuple[Core, callsite.Site], *, rank: int, group: str, seq: int, members: Any
) -> Fingerprint:
    """A record from the compact form that travels between ranks."""
    core, site = payload
    op, ins, outs, reduce_op, root, peer, in_splits, out_splits, count, finite, tag = core
    return Fingerprint(
        rank=rank,
        group=group,
        seq=seq,
        op=op,
        inputs=tuple(TensorSpec(tuple(s), d, dev) for s, d, dev in ins),
        outputs=tuple(TensorSpec(tuple(s), d, dev) for s, d, dev in outs),
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
    )
