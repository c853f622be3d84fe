"""Do the ranks' fingerprints for one collective fit together? Pure functions, no torch.

`match(fingerprints)` takes one `Fingerprint` per member of a group at one (group, seq) and
returns None when the calls fit, or a `Mismatch` naming the kind, the ranks at fault and a message
with one line per rank. Every rank runs it on the same fingerprints, so every rank raises the same
error. `match_p2p(send, recv)` does the same for one point-to-point message.

The rules are the ones the backends rely on, so that valid programs never fail here:

- every rank calls the same op (aliases such as `all_gather_into_tensor` / `all_gather_single`
  count as one) with the same root, reduce op, dtype and device type;
- one-tensor ops (`all_reduce`, `broadcast`, `reduce`) agree on the shape;
- list ops line up per rank: `all_gather` output j, `gather`'s list on dst, `scatter`'s list on
  src, `reduce_scatter`'s input j all match rank j's tensor; `all_to_all` input j of rank i
  matches output i of rank j;
- flat ops agree in numel: `all_gather_single` output = world x input, `reduce_scatter_single`
  input = world x output;
- `all_to_all_single` split sizes agree pairwise: what rank i sends to j (its input split j) is
  what j expects from i (its output split i); no splits means an even split;
- root-only arguments (`gather_list`, `scatter_list`) are given on the root only; object
  collectives agree on list lengths.

Checks run in a fixed order (group, op, count, root, reduce op, device, dtype, split sizes, shape,
finiteness) and the first that fails is the verdict.
"""

from __future__ import annotations

from collections.abc import Sequence

from distnb.judgement.mismatch import build_mismatch
from distnb.judgement.rules import RULES, p2p_rule
from distnb.judgement.words import canonical_op, describe, where
from distnb.records.collective import Fingerprint, MatchKind, Mismatch

__all__ = ["canonical_op", "deadlock", "describe", "match", "match_p2p"]


def match(fingerprints: Sequence[Fingerprint], held: bool = True) -> Mismatch | None:
    """None when the members' calls at one (group, seq) fit together, else the mismatch
    (`held`: a check holds the calls, as on distnb's ranks; False: they went to the backend).

    >>> from distnb.records.collective import TensorSpec as T
    >>> a = Fingerprint(0, "WORLD", 3, "all_reduce", (T((8,), "float32"),), reduce_op="SUM")
    >>> b = Fingerprint(1, "WORLD", 3, "all_reduce", (T((4,), "float32"),), reduce_op="SUM")
    >>> match([a, b]).kind
    <MatchKind.SHAPE: 'shape'>
    """
    fps = sorted(fingerprints, key=lambda f: f.rank)
    for rule in RULES:
        found = rule(fps)
        if found is not None:
            return build_mismatch(fps, *found, held=held)
    return None


def match_p2p(send: Fingerprint, recv: Fingerprint) -> Mismatch | None:
    """None when `recv`'s buffer fits what `send` sends, else the mismatch (seq: the channel's)."""
    fps = sorted([send, recv], key=lambda f: f.rank)
    found = p2p_rule(send, recv)
    return None if found is None else build_mismatch(fps, *found)


def deadlock(a: Fingerprint, b: Fingerprint) -> Mismatch:
    """Two ranks that wait for each other in different calls: neither can go on.

    `a` and `b` are what each waits in (a collective at its group and seq, or a receive from
    the other). Both in collectives: a group mismatch; both receiving: a peer mismatch; one of
    each: an op type mismatch, likely a skipped call.
    """
    fps = sorted([a, b], key=lambda f: f.rank)
    p2p = [canonical_op(f.op) in ("send", "recv") for f in fps]
    kind = (
        MatchKind.PEER
        if all(p2p)
        else MatchKind.GROUP
        if not any(p2p)
        else MatchKind.COLLECTIVE_TYPE
    )
    waits = " and ".join(f"rank {f.rank} waits in {where(f)}" for f in fps)
    detail = f"{waits}; each waits for the other, so neither can go on"
    return build_mismatch(fps, kind, detail, (fps[0].rank, fps[1].rank), deadlocked=True)
