"""Shape rules, one per op: which tensors must agree, and how (per rank, per pair, in numel)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from distnb.judgement.mismatch import Found
from distnb.judgement.words import canonical_op, first_spec, odd_ones, per_rank, shape
from distnb.ranklist import format_ranks
from distnb.records.collective import Fingerprint, MatchKind


def shape_rule(fps: Sequence[Fingerprint]) -> Found | None:
    check = SHAPE_CHECKS.get(canonical_op(fps[0].op))
    return None if check is None else check(fps)


def _same_input_shape(fps: Sequence[Fingerprint]) -> Found | None:
    shapes = {f.rank: f.inputs[0].shape if f.inputs else None for f in fps}
    if len(set(shapes.values())) == 1:
        return None
    found = per_rank({r: shape(s) for r, s in shapes.items()})
    return MatchKind.SHAPE, f"the tensors differ in shape ({found})", odd_ones(shapes)


def _list_per_rank(
    fps: Sequence[Fingerprint], holders: Sequence[Fingerprint], list_name: str, own: str
) -> Found | None:
    """Each holder's list has one tensor per rank, and entry j is shaped like rank j's `own`."""
    world = len(fps)
    for h in holders:
        lst = h.outputs if list_name.startswith("out") else h.inputs
        if len(lst) != world:
            detail = f"rank {h.rank}'s {list_name} has {len(lst)} tensors for {world} ranks"
            return MatchKind.SHAPE, detail, (h.rank,)
        for j, f in enumerate(fps):
            mine = f.inputs if own == "input" else f.outputs
            theirs = mine[0].shape if mine else None
            if lst[j].shape != theirs:
                detail = (
                    f"rank {h.rank}'s {list_name}[{j}] is {shape(lst[j].shape)} but rank "
                    f"{f.rank}'s {own} is {shape(theirs)}"
                )
                return MatchKind.SHAPE, detail, (h.rank, f.rank)
    return None


def _all_gather(fps: Sequence[Fingerprint]) -> Found | None:
    return _list_per_rank(fps, fps, "output list", "input")


def _reduce_scatter(fps: Sequence[Fingerprint]) -> Found | None:
    return _list_per_rank(fps, fps, "input list", "output")


def _gather(fps: Sequence[Fingerprint]) -> Found | None:
    return _rooted_list(fps, "output list", "input", "gather_list", "dst")


def _scatter(fps: Sequence[Fingerprint]) -> Found | None:
    return _rooted_list(fps, "input list", "output", "scatter_list", "src")


def _rooted_list(
    fps: Sequence[Fingerprint], list_name: str, own: str, arg: str, root_arg: str
) -> Found | None:
    root = fps[0].root
    field = "outputs" if list_name.startswith("out") else "inputs"
    extra = tuple(f.rank for f in fps if f.rank != root and getattr(f, field))
    if extra:
        where = format_ranks(extra)
        return MatchKind.ROOT, f"{arg} is given on {where}, which is not {root_arg} ({root})", extra
    holders = [f for f in fps if f.rank == root]
    return _list_per_rank(fps, holders, list_name, own)


def _flat(fps: Sequence[Fingerprint], big: str) -> Found | None:
    """all_gather_single (big=output), reduce_scatter_single (big=input): big = world x small."""
    world = len(fps)
    small = "input" if big == "output" else "output"
    smalls = {f.rank: first_spec(f, small).shape for f in fps}
    if len(set(smalls.values())) > 1:
        found = per_rank({r: shape(s) for r, s in smalls.items()})
        return MatchKind.SHAPE, f"the {small} tensors differ in shape ({found})", odd_ones(smalls)
    for f in fps:
        b, s = first_spec(f, big), first_spec(f, small)
        if b.numel != world * s.numel:
            detail = (
                f"rank {f.rank}'s {big} has {b.numel} elements ({shape(b.shape)}); "
                f"it needs {world} x {s.numel} = {world * s.numel} for {world} ranks"
            )
            return MatchKind.SHAPE, detail, (f.rank,)
    return None


def _all_to_all(fps: Sequence[Fingerprint]) -> Found | None:
    world = len(fps)
    for f in fps:
        for name, lst in (("input list", f.inputs), ("output list", f.outputs)):
            if len(lst) != world:
                detail = f"rank {f.rank}'s {name} has {len(lst)} tensors for {world} ranks"
                return MatchKind.SHAPE, detail, (f.rank,)
    for i, fi in enumerate(fps):
        for j, fj in enumerate(fps):
            if fi.inputs[j].shape != fj.outputs[i].shape:
                detail = (
                    f"rank {fi.rank} sends {shape(fi.inputs[j].shape)} to rank {fj.rank}, but "
                    f"rank {fj.rank} expects {shape(fj.outputs[i].shape)} from rank {fi.rank}"
                )
                return MatchKind.SHAPE, detail, (fi.rank, fj.rank)
    return None


def _all_to_all_single(fps: Sequence[Fingerprint]) -> Found | None:
    rows = {
        f.rank: (first_spec(f, "input").shape[1:], first_spec(f, "output").shape[1:]) for f in fps
    }
    trailing = {s for pair in rows.values() for s in pair}
    if len(trailing) <= 1:
        return None
    found = per_rank({r: f"in {shape(i)} out {shape(o)}" for r, (i, o) in rows.items()})
    return MatchKind.SHAPE, f"rows differ in shape ({found})", odd_ones(rows)


SHAPE_CHECKS: dict[str, Callable[[Sequence[Fingerprint]], Found | None]] = {
    "all_reduce": _same_input_shape,
    "broadcast": _same_input_shape,
    "reduce": _same_input_shape,
    "all_gather": _all_gather,
    "gather": _gather,
    "scatter": _scatter,
    "reduce_scatter": _reduce_scatter,
    "all_gather_single": lambda fps: _flat(fps, "output"),
    "reduce_scatter_single": lambda fps: _flat(fps, "input"),
    "all_to_all": _all_to_all,
    "all_to_all_single": _all_to_all_single,
}
