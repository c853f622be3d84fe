"""The rules, in the order they are tried; the first that finds a fault is the verdict."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from distnb.judgement.mismatch import Found, Rule, framework_skip
from distnb.judgement.shapes import shape_rule
from distnb.judgement.words import (
    ROOTED,
    canonical_op,
    group_name,
    odd_ones,
    per_rank,
    rows,
    short_list,
)
from distnb.ranklist import GROUP_FROM, format_ranks, same_ranks
from distnb.records.collective import Fingerprint, MatchKind, TensorSpec


def _group_rule(fps: Sequence[Fingerprint]) -> Found | None:
    first = fps[0]
    members = first.group_ranks  # records decoded from one reply share it: no N-long compare
    if all(
        f.group == first.group and (f.group_ranks is members or f.group_ranks == members)
        for f in fps
    ):
        return None
    odd = odd_ones({f.rank: (f.group, f.group_ranks) for f in fps})
    names = per_rank({f.rank: group_name(f) for f in fps}, " on ")
    return MatchKind.GROUP, f"the ranks call it on different groups ({names})", odd


def _op_rule(fps: Sequence[Fingerprint]) -> Found | None:
    ops = {f.rank: canonical_op(f.op) for f in fps}
    if len(set(ops.values())) == 1:
        return None
    skip = framework_skip(fps)
    if skip is not None:  # in the framework user's words: who skipped which function's call
        return MatchKind.COLLECTIVE_TYPE, skip[1], odd_ones(ops)
    said = [(f.rank, f.op) for f in fps]
    groups = same_ranks(said) if len(fps) >= GROUP_FROM else [([r], op) for r, op in said]
    calls = ", ".join(
        f"{format_ranks(ranks)} call{'s' if len(ranks) == 1 else ''} {op}" for ranks, op in groups
    )
    return MatchKind.COLLECTIVE_TYPE, calls, odd_ones(ops)


def _model_rule(fps: Sequence[Fingerprint]) -> Found | None:
    """DDP's constructor: every rank's model has the same parameters, by name and spec."""
    models = {f.rank: f.params for f in fps}
    if not any(models.values()) or len(set(models.values())) == 1:
        return None
    odd = odd_ones(models)
    usual = next((f for f in fps if f.rank not in odd), fps[0])
    other = next(f for f in fps if f.params != usual.params)
    return MatchKind.MODEL, model_difference(usual, other), odd


def model_difference(a: Fingerprint, b: Fingerprint) -> str:
    """The first parameter in which two ranks' models differ, by name and spec."""
    for i, (pa, pb) in enumerate(zip(a.params, b.params)):
        if pa == pb:
            continue
        if pa.name == pb.name:
            return (
                f"parameter {pa.name!r} is {pa.spec} on rank {a.rank} "
                f"and {pb.spec} on rank {b.rank}"
            )
        return (
            f"parameter {i} is {pa.name!r} ({pa.spec}) on rank {a.rank} "
            f"and {pb.name!r} ({pb.spec}) on rank {b.rank}"
        )
    longer, shorter = (a, b) if len(a.params) > len(b.params) else (b, a)
    extra = longer.params[len(shorter.params)]
    return (
        f"rank {longer.rank}'s model has {len(longer.params)} parameters, rank "
        f"{shorter.rank}'s {len(shorter.params)}; the first one rank {shorter.rank} lacks is "
        f"{extra.name!r} ({extra.spec})"
    )


def _count_rule(fps: Sequence[Fingerprint]) -> Found | None:
    op, world = canonical_op(fps[0].op), len(fps)
    if op == "broadcast_object_list":
        counts = {f.rank: f.count for f in fps}
        if len(set(counts.values())) > 1:
            lens = per_rank({r: str(c) for r, c in counts.items()})
            return MatchKind.COUNT, f"object_list lengths differ ({lens})", odd_ones(counts)
    elif op == "all_gather_object":
        short = tuple(f.rank for f in fps if f.count is not None and f.count < world)
        if short:
            return MatchKind.COUNT, short_list("object_list", short, fps, world), short
    elif op in ("gather_object", "scatter_object_list"):
        name = "object_gather_list" if op == "gather_object" else "scatter_object_input_list"
        root = fps[0].root
        bad = tuple(f.rank for f in fps if f.rank == root and (f.count or 0) != world)
        if bad:
            return MatchKind.COUNT, short_list(name, bad, fps, world), bad
        extra = tuple(f.rank for f in fps if f.rank != root and f.count is not None)
        if op == "gather_object" and extra:
            where = format_ranks(extra)
            return MatchKind.ROOT, f"{name} is given on {where}, which is not dst ({root})", extra
    return None


def _root_rule(fps: Sequence[Fingerprint]) -> Found | None:
    op = canonical_op(fps[0].op)
    if op not in ROOTED:
        return None
    roots = {f.rank: f.root for f in fps}
    if len(set(roots.values())) == 1:
        return None
    arg = ROOTED[op]
    found = per_rank({r: f"{arg}={v}" for r, v in roots.items()})
    return MatchKind.ROOT, f"the ranks name different roots ({found})", odd_ones(roots)


def _reduce_op_rule(fps: Sequence[Fingerprint]) -> Found | None:
    ops = {f.rank: f.reduce_op for f in fps}
    if len(set(ops.values())) == 1:
        return None
    found = per_rank({r: f"op={v}" for r, v in ops.items()})
    return MatchKind.REDUCE_OP, f"the ranks reduce with different ops ({found})", odd_ones(ops)


def _device_rule(fps: Sequence[Fingerprint]) -> Found | None:
    return _spec_attr_rule(fps, MatchKind.DEVICE, lambda s: s.device)


def _dtype_rule(fps: Sequence[Fingerprint]) -> Found | None:
    return _spec_attr_rule(fps, MatchKind.DTYPE, lambda s: s.dtype)


def _spec_attr_rule(
    fps: Sequence[Fingerprint], kind: MatchKind, attr: Callable[[TensorSpec], str]
) -> Found | None:
    held = {f.rank: tuple(sorted({attr(s) for s in (*f.inputs, *f.outputs)})) for f in fps}
    values = {v for vs in held.values() for v in vs}
    if len(values) <= 1:
        return None
    found = per_rank({r: "/".join(v) or "-" for r, v in held.items()})
    odd = odd_ones({r: v for r, v in held.items() if v})
    return kind, f"tensors of different {kind.value}s ({found})", odd


def _splits_rule(fps: Sequence[Fingerprint]) -> Found | None:
    if canonical_op(fps[0].op) != "all_to_all_single":
        return None
    world = len(fps)
    sends: dict[int, tuple[int, ...]] = {}
    recvs: dict[int, tuple[int, ...]] = {}
    for i, f in enumerate(fps):
        if not f.inputs or not f.outputs:
            return None
        found = _own_splits(f, world)
        if isinstance(found, str):
            return MatchKind.SPLIT_SIZES, found, (f.rank,)
        sends[i], recvs[i] = found
    for i, fi in enumerate(fps):
        for j, fj in enumerate(fps):
            if sends[i][j] != recvs[j][i]:
                detail = (
                    f"rank {fi.rank} sends {rows(sends[i][j])} to rank {fj.rank}, "
                    f"but rank {fj.rank} expects {rows(recvs[j][i])} from rank {fi.rank}"
                )
                return MatchKind.SPLIT_SIZES, detail, (fi.rank, fj.rank)
    return None


def _own_splits(f: Fingerprint, world: int) -> tuple[tuple[int, ...], tuple[int, ...]] | str:
    """A rank's (input, output) split sizes, even splits filled in; a message if they are bad."""
    halves = []
    for name, spec, splits in (
        ("input", f.inputs[0], f.in_splits),
        ("output", f.outputs[0], f.out_splits),
    ):
        rows = spec.shape[0] if spec.shape else 1
        if splits is None:
            if rows % world:
                return f"rank {f.rank}'s {name} has {rows} rows, not a multiple of {world} ranks"
            splits = (rows // world,) * world
        if len(splits) != world:
            return f"rank {f.rank} gives {len(splits)} {name} split sizes for {world} ranks"
        if sum(splits) != rows:
            return (
                f"rank {f.rank}'s {name} split sizes add up to {sum(splits)}, not its {rows} rows"
            )
        halves.append(tuple(splits))
    return halves[0], halves[1]


def _non_finite_rule(fps: Sequence[Fingerprint]) -> Found | None:
    bad = tuple(f.rank for f in fps if f.finite is False)
    if not bad:
        return None
    verb = "holds" if len(bad) == 1 else "hold"
    return MatchKind.NON_FINITE, f"the input on {format_ranks(bad)} {verb} NaN or Inf", bad


def p2p_rule(send: Fingerprint, recv: Fingerprint) -> Found | None:
    s, r = (send.inputs or send.outputs), (recv.outputs or recv.inputs)
    if not s or not r:
        return None
    sent, buf = s[0], r[0]
    pair = (send.rank, recv.rank)
    for kind, a, b in (
        (MatchKind.DEVICE, sent.device, buf.device),
        (MatchKind.DTYPE, sent.dtype, buf.dtype),
        (MatchKind.SHAPE, sent.shape, buf.shape),
    ):
        if a != b:
            detail = f"rank {send.rank} sends {sent}, rank {recv.rank} receives into {buf}"
            return kind, detail, pair
    return None


RULES: tuple[Rule, ...] = (
    _group_rule,
    _op_rule,
    _model_rule,
    _count_rule,
    _root_rule,
    _reduce_op_rule,
    _device_rule,
    _dtype_rule,
    _splits_rule,
    shape_rule,
    _non_finite_rule,
)
