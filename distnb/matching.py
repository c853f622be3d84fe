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

from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence

from distnb.ranklist import format_ranks
from distnb.records.collective import Fingerprint, MatchKind, Mismatch, TensorSpec

__all__ = ["canonical_op", "deadlock", "describe", "match", "match_p2p"]

# Names of one underlying op; torch 2.13 deprecates the left-hand names for the right-hand ones.
_ALIASES = {
    "all_gather_into_tensor": "all_gather_single",
    "_all_gather_base": "all_gather_single",
    "reduce_scatter_tensor": "reduce_scatter_single",
    "_reduce_scatter_base": "reduce_scatter_single",
    "isend": "send",
    "irecv": "recv",
}
_ROOTED = {
    "broadcast": "src",
    "reduce": "dst",
    "gather": "dst",
    "scatter": "src",
    "gather_object": "dst",
    "scatter_object_list": "src",
    "broadcast_object_list": "src",
}
_REDUCING = {"all_reduce", "reduce", "reduce_scatter", "reduce_scatter_single"}
_SAME_SHAPE = {"all_reduce", "broadcast", "reduce"}

SKIP_HINT = (
    "the ranks called different collectives from different lines: a rank may have skipped a "
    "collective (a branch on the rank, an early return) so that its next call met its peers' "
    "earlier one"
)

# (kind, detail, ranks at fault); ranks empty means "every rank"
Found = tuple[MatchKind, str, tuple[int, ...]]
Rule = Callable[[Sequence[Fingerprint]], "Found | None"]


def canonical_op(op: str) -> str:
    """The op's one name: `"all_gather_into_tensor"` -> `"all_gather_single"`."""
    return _ALIASES.get(op, op)


def match(fingerprints: Sequence[Fingerprint]) -> Mismatch | None:
    """None when the members' calls at one (group, seq) fit together, else the mismatch.

    >>> from distnb.records.collective import TensorSpec as T
    >>> a = Fingerprint(0, "WORLD", 3, "all_reduce", (T((8,), "float32"),), reduce_op="SUM")
    >>> b = Fingerprint(1, "WORLD", 3, "all_reduce", (T((4,), "float32"),), reduce_op="SUM")
    >>> match([a, b]).kind
    <MatchKind.SHAPE: 'shape'>
    """
    fps = sorted(fingerprints, key=lambda f: f.rank)
    for rule in _RULES:
        found = rule(fps)
        if found is not None:
            return _mismatch(fps, *found)
    return None


def match_p2p(send: Fingerprint, recv: Fingerprint) -> Mismatch | None:
    """None when `recv`'s buffer fits what `send` sends, else the mismatch (seq: the channel's)."""
    fps = sorted([send, recv], key=lambda f: f.rank)
    found = _p2p_rule(send, recv)
    return None if found is None else _mismatch(fps, *found)


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
    waits = " and ".join(f"rank {f.rank} waits in {_where(f)}" for f in fps)
    detail = f"{waits}; each waits for the other, so neither can go on"
    return _mismatch(fps, kind, detail, (fps[0].rank, fps[1].rank), deadlocked=True)


def describe(fp: Fingerprint) -> str:
    """One rank's call as a line of the message: `all_reduce(float32[8], op=SUM)`."""
    op = fp.op
    args: list[str] = []
    base = canonical_op(op)
    if base in ("send", "recv"):
        args.append(_specs(fp.inputs or fp.outputs))
        args.append(f"{'dst' if base == 'send' else 'src'}={_opt(fp.peer)}")
        if fp.tag:
            args.append(f"tag={fp.tag}")
    elif fp.count is not None or op.endswith(("_object", "_object_list")):
        args.append(f"{fp.count} objects" if fp.count is not None else "no list")
    elif base in _SAME_SHAPE:
        args.append(_specs(fp.inputs))
    elif fp.inputs or fp.outputs:
        args.append(f"out={_specs(fp.outputs)}")
        args.append(f"in={_specs(fp.inputs)}")
    if fp.out_splits is not None or fp.in_splits is not None:
        args.append(f"out_splits={_opt_list(fp.out_splits)}")
        args.append(f"in_splits={_opt_list(fp.in_splits)}")
    if fp.reduce_op:
        args.append(f"op={fp.reduce_op}")
    if base in _ROOTED:
        args.append(f"{_ROOTED[base]}={_opt(fp.root)}")
    if fp.finite is False:
        args.append("input not finite")
    return f"{op}({', '.join(a for a in args if a)})"


# --- rules ------------------------------------------------------------------------------------


def _group_rule(fps: Sequence[Fingerprint]) -> Found | None:
    labels = {(f.group, f.group_ranks) for f in fps}
    if len(labels) == 1:
        return None
    odd = _odd_ones({f.rank: (f.group, f.group_ranks) for f in fps})
    names = ", ".join(f"rank {f.rank} on {_group(f)}" for f in fps)
    return MatchKind.GROUP, f"the ranks call it on different groups ({names})", odd


def _op_rule(fps: Sequence[Fingerprint]) -> Found | None:
    ops = {f.rank: canonical_op(f.op) for f in fps}
    if len(set(ops.values())) == 1:
        return None
    calls = ", ".join(f"rank {f.rank} calls {f.op}" for f in fps)
    return MatchKind.COLLECTIVE_TYPE, calls, _odd_ones(ops)


def _count_rule(fps: Sequence[Fingerprint]) -> Found | None:
    op, world = canonical_op(fps[0].op), len(fps)
    if op == "broadcast_object_list":
        counts = {f.rank: f.count for f in fps}
        if len(set(counts.values())) > 1:
            lens = ", ".join(f"rank {r}: {c}" for r, c in counts.items())
            return MatchKind.COUNT, f"object_list lengths differ ({lens})", _odd_ones(counts)
    elif op == "all_gather_object":
        short = tuple(f.rank for f in fps if f.count is not None and f.count < world)
        if short:
            return MatchKind.COUNT, _short_list("object_list", short, fps, world), short
    elif op in ("gather_object", "scatter_object_list"):
        name = "object_gather_list" if op == "gather_object" else "scatter_object_input_list"
        root = fps[0].root
        bad = tuple(f.rank for f in fps if f.rank == root and (f.count or 0) != world)
        if bad:
            return MatchKind.COUNT, _short_list(name, bad, fps, world), bad
        extra = tuple(f.rank for f in fps if f.rank != root and f.count is not None)
        if op == "gather_object" and extra:
            where = format_ranks(extra)
            return MatchKind.ROOT, f"{name} is given on {where}, which is not dst ({root})", extra
    return None


def _root_rule(fps: Sequence[Fingerprint]) -> Found | None:
    op = canonical_op(fps[0].op)
    if op not in _ROOTED:
        return None
    roots = {f.rank: f.root for f in fps}
    if len(set(roots.values())) == 1:
        return None
    arg = _ROOTED[op]
    found = ", ".join(f"rank {r}: {arg}={v}" for r, v in roots.items())
    return MatchKind.ROOT, f"the ranks name different roots ({found})", _odd_ones(roots)


def _reduce_op_rule(fps: Sequence[Fingerprint]) -> Found | None:
    ops = {f.rank: f.reduce_op for f in fps}
    if len(set(ops.values())) == 1:
        return None
    found = ", ".join(f"rank {r}: op={v}" for r, v in ops.items())
    return MatchKind.REDUCE_OP, f"the ranks reduce with different ops ({found})", _odd_ones(ops)


def _device_rule(fps: Sequence[Fingerprint]) -> Found | None:
    return _spec_attr_rule(fps, MatchKind.DEVICE, lambda s: s.device)


def _dtype_rule(fps: Sequence[Fingerprint]) -> Found | None:
    return _spec_attr_rule(fps, MatchKind.DTYPE, lambda s: s.dtype)


def _spec_attr_rule(
    fps: Sequence[Fingerprint], kind: MatchKind, attr: Callable[[TensorSpec], str]
) -> Found | None:
    per_rank = {f.rank: tuple(sorted({attr(s) for s in (*f.inputs, *f.outputs)})) for f in fps}
    values = {v for vs in per_rank.values() for v in vs}
    if len(values) <= 1:
        return None
    found = ", ".join(f"rank {r}: {'/'.join(v) or '-'}" for r, v in per_rank.items())
    odd = _odd_ones({r: v for r, v in per_rank.items() if v})
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
                    f"rank {fi.rank} sends {_rows(sends[i][j])} to rank {fj.rank}, "
                    f"but rank {fj.rank} expects {_rows(recvs[j][i])} from rank {fi.rank}"
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


def _shape_rule(fps: Sequence[Fingerprint]) -> Found | None:
    check = _SHAPE_CHECKS.get(canonical_op(fps[0].op))
    return None if check is None else check(fps)


def _same_input_shape(fps: Sequence[Fingerprint]) -> Found | None:
    shapes = {f.rank: f.inputs[0].shape if f.inputs else None for f in fps}
    if len(set(shapes.values())) == 1:
        return None
    found = ", ".join(f"rank {r}: {_shape(s)}" for r, s in shapes.items())
    return MatchKind.SHAPE, f"the tensors differ in shape ({found})", _odd_ones(shapes)


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
                    f"rank {h.rank}'s {list_name}[{j}] is {_shape(lst[j].shape)} but rank "
                    f"{f.rank}'s {own} is {_shape(theirs)}"
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
    smalls = {f.rank: _first(f, small).shape for f in fps}
    if len(set(smalls.values())) > 1:
        found = ", ".join(f"rank {r}: {_shape(s)}" for r, s in smalls.items())
        return MatchKind.SHAPE, f"the {small} tensors differ in shape ({found})", _odd_ones(smalls)
    for f in fps:
        b, s = _first(f, big), _first(f, small)
        if b.numel != world * s.numel:
            detail = (
                f"rank {f.rank}'s {big} has {b.numel} elements ({_shape(b.shape)}); "
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
                    f"rank {fi.rank} sends {_shape(fi.inputs[j].shape)} to rank {fj.rank}, but "
                    f"rank {fj.rank} expects {_shape(fj.outputs[i].shape)} from rank {fi.rank}"
                )
                return MatchKind.SHAPE, detail, (fi.rank, fj.rank)
    return None


def _all_to_all_single(fps: Sequence[Fingerprint]) -> Found | None:
    rows = {f.rank: (_first(f, "input").shape[1:], _first(f, "output").shape[1:]) for f in fps}
    trailing = {s for pair in rows.values() for s in pair}
    if len(trailing) <= 1:
        return None
    found = ", ".join(f"rank {r}: in {_shape(i)} out {_shape(o)}" for r, (i, o) in rows.items())
    return MatchKind.SHAPE, f"rows differ in shape ({found})", _odd_ones(rows)


def _non_finite_rule(fps: Sequence[Fingerprint]) -> Found | None:
    bad = tuple(f.rank for f in fps if f.finite is False)
    if not bad:
        return None
    verb = "holds" if len(bad) == 1 else "hold"
    return MatchKind.NON_FINITE, f"the input on {format_ranks(bad)} {verb} NaN or Inf", bad


def _p2p_rule(send: Fingerprint, recv: Fingerprint) -> Found | None:
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


_SHAPE_CHECKS: dict[str, Callable[[Sequence[Fingerprint]], Found | None]] = {
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

_RULES: tuple[Rule, ...] = (
    _group_rule,
    _op_rule,
    _count_rule,
    _root_rule,
    _reduce_op_rule,
    _device_rule,
    _dtype_rule,
    _splits_rule,
    _shape_rule,
    _non_finite_rule,
)


# --- messages ---------------------------------------------------------------------------------


def _mismatch(
    fps: Sequence[Fingerprint],
    kind: MatchKind,
    detail: str,
    ranks: tuple[int, ...],
    deadlocked: bool = False,
) -> Mismatch:
    first = fps[0]
    ops = list(dict.fromkeys(f.op for f in fps))
    op = "/".join(ops)
    hint = ""
    if kind is MatchKind.COLLECTIVE_TYPE and len({(f.site.file, f.site.line) for f in fps}) > 1:
        hint = SKIP_HINT
    if deadlocked:
        where = ""
    elif canonical_op(first.op) in ("send", "recv"):
        src, dst = fps[0].rank, fps[-1].rank
        if canonical_op(first.op) == "recv":
            src, dst = dst, src
        where = f"{op} #{first.seq} from rank {src} to rank {dst} on {_group(first)}"
    else:
        where = f"{op} #{first.seq} on {_group(first)}"
    lines = [f"{kind.value} mismatch{' in ' + where if where else ''}: {detail}"]
    calls = [describe(f) for f in fps]
    width = max(len(c) for c in calls)
    for f, call in zip(fps, calls, strict=True):
        code = f": {f.site.code}" if f.site.code else ""
        lines.append(f"  rank {f.rank}: {call.ljust(width)}  at {f.site}{code}")
    if hint:
        lines.append(f"hint: {hint}")
    if canonical_op(first.op) in ("send", "recv") and not deadlocked:
        # the receiver takes the message into a scratch tensor, so the sender is not left hanging
        lines.append(
            "The message went to a scratch buffer, not yours; the process group still works."
        )
    else:
        lines.append("Nothing was sent; the process group still works.")
    return Mismatch(
        kind=kind,
        op=op,
        group="/".join(dict.fromkeys(f.group for f in fps)),
        seq=first.seq,
        fingerprints=tuple(fps),
        message="\n".join(lines),
        detail=detail,
        ranks=tuple(sorted(set(ranks))) or tuple(f.rank for f in fps),
        hint=hint,
    )


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


def _where(f: Fingerprint) -> str:
    """`all_reduce #3 on WORLD`, `recv #0 from rank 1 on WORLD`."""
    if canonical_op(f.op) == "recv":
        return f"{f.op} #{f.seq} from rank {f.peer} on {_group(f)}"
    return f"{f.op} #{f.seq} on {_group(f)}"


def _group(f: Fingerprint) -> str:
    """`WORLD`, or a sub-group with its members: `g1 (ranks 0-1)`."""
    if f.group == "WORLD" or not f.group_ranks:
        return f.group
    return f"{f.group} ({format_ranks(f.group_ranks)})"


def _odd_ones(values: Mapping[int, Hashable]) -> tuple[int, ...]:
    """Ranks whose value differs from the most common one; every rank when there is no majority."""
    counts = Counter(values.values()).most_common()
    if len(counts) > 1 and counts[0][1] > counts[1][1]:
        usual = counts[0][0]
        return tuple(r for r, v in values.items() if v != usual)
    return tuple(values)


def _short_list(name: str, ranks: Sequence[int], fps: Sequence[Fingerprint], world: int) -> str:
    counts = {f.rank: f.count for f in fps}
    found = ", ".join(f"rank {r}: {counts[r]}" for r in ranks)
    return f"{name} needs {world} entries for {world} ranks ({found})"


def _first(f: Fingerprint, which: str) -> TensorSpec:
    specs = f.inputs if which == "input" else f.outputs
    return specs[0] if specs else TensorSpec((), "")


def _specs(specs: Sequence[TensorSpec]) -> str:
    if not specs:
        return "[]"
    if len(specs) == 1:
        return str(specs[0])
    if len(set(specs)) == 1:
        return f"[{specs[0]} x{len(specs)}]"
    return "[" + ", ".join(map(str, specs)) + "]"


def _shape(shape: tuple[int, ...] | None) -> str:
    return "none" if shape is None else "[" + ", ".join(map(str, shape)) + "]"


def _opt(value: int | None) -> str:
    return "None" if value is None else str(value)


def _opt_list(values: tuple[int, ...] | None) -> str:
    return "even" if values is None else "[" + ", ".join(map(str, values)) + "]"
