"""The words of mismatch messages: op names, calls, shapes, groups. Pure, no torch."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping, Sequence

from distnb.ranklist import GROUP_FROM, format_ranks, same_ranks
from distnb.records.collective import Fingerprint, TensorSpec

# Names of one underlying op; torch 2.13 deprecates the left-hand names for the right-hand ones.
ALIASES = {
    "all_gather_into_tensor": "all_gather_single",
    "_all_gather_base": "all_gather_single",
    "reduce_scatter_tensor": "reduce_scatter_single",
    "_reduce_scatter_base": "reduce_scatter_single",
    "isend": "send",
    "irecv": "recv",
}
ROOTED = {
    "broadcast": "src",
    "reduce": "dst",
    "gather": "dst",
    "scatter": "src",
    "gather_object": "dst",
    "scatter_object_list": "src",
    "broadcast_object_list": "src",
}
SAME_SHAPE = {"all_reduce", "broadcast", "reduce"}
# The frameworks whose functions name the collectives they make (the first word of an origin,
# see `distnb.rank.checked.frameworks`). A call is one the user asked for unless its label says
# the framework's loop made it (`Lightning strategy.barrier`, `Lightning fit loop ...`).
FRAMEWORKS = ("Lightning", "Fabric", "Accelerate", "torchmetrics", "Ignite", "Trainer")
LOOP_LABELS = ("strategy.", "fit loop")


def framework_of(origin: str) -> str:
    """The framework a call's origin names (`Lightning`), or ''."""
    first = origin.partition(" ")[0]
    return first if first in FRAMEWORKS else ""


def framework_call(origin: str) -> bool:
    """Whether a call's origin is a framework function the user calls:
    `Lightning self.log(sync_dist=True)`, not `Lightning strategy.barrier`."""
    return bool(framework_of(origin)) and not origin.partition(" ")[2].startswith(LOOP_LABELS)


def canonical_op(op: str) -> str:
    """The op's one name: `"all_gather_into_tensor"` -> `"all_gather_single"`."""
    return ALIASES.get(op, op)


def describe(fp: Fingerprint) -> str:
    """One rank's call as a line of the message: `all_reduce(float32[8], op=SUM)`."""
    op = fp.op
    args: list[str] = []
    base = canonical_op(op)
    if base in ("send", "recv"):
        args.append(specs(fp.inputs or fp.outputs))
        args.append(f"{'dst' if base == 'send' else 'src'}={opt(fp.peer)}")
        if fp.tag:
            args.append(f"tag={fp.tag}")
    elif fp.count is not None or op.endswith(("_object", "_object_list")):
        args.append(f"{fp.count} objects" if fp.count is not None else "no list")
    elif base in SAME_SHAPE:
        args.append(specs(fp.inputs))
    elif fp.inputs or fp.outputs:
        args.append(f"out={specs(fp.outputs)}")
        args.append(f"in={specs(fp.inputs)}")
    if fp.out_splits is not None or fp.in_splits is not None:
        args.append(f"out_splits={opt_list(fp.out_splits)}")
        args.append(f"in_splits={opt_list(fp.in_splits)}")
    if fp.reduce_op:
        args.append(f"op={fp.reduce_op}")
    if base in ROOTED:
        args.append(f"{ROOTED[base]}={opt(fp.root)}")
    if fp.finite is False:
        args.append("input not finite")
    return f"{op}({', '.join(a for a in args if a)})"


def per_rank(values: Mapping[int, str], sep: str = ": ") -> str:
    """`rank 0: [8], rank 1: [4]`; from `GROUP_FROM` ranks on, ranks with the same value share
    one part (`ranks 0-15,17-31: [8], rank 16: [4]`), so 32 ranks do not make 32 parts."""
    said = list(values.items())
    groups = same_ranks(said) if len(said) >= GROUP_FROM else [([r], v) for r, v in said]
    return ", ".join(f"{format_ranks(ranks)}{sep}{value}" for ranks, value in groups)


def rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


def where(f: Fingerprint) -> str:
    """`all_reduce #3 on WORLD`, `recv #0 from rank 1 on WORLD`."""
    if canonical_op(f.op) == "recv":
        return f"{f.op} #{f.seq} from rank {f.peer} on {group_name(f)}"
    return f"{f.op} #{f.seq} on {group_name(f)}"


def group_name(f: Fingerprint) -> str:
    """`WORLD`, or a sub-group with its members: `g1 (ranks 0-1)`."""
    if f.group == "WORLD" or not f.group_ranks:
        return f.group
    return f"{f.group} ({format_ranks(f.group_ranks)})"


def odd_ones(values: Mapping[int, Hashable]) -> tuple[int, ...]:
    """Ranks whose value differs from the most common one; every rank when there is no majority."""
    counts = Counter(values.values()).most_common()
    if len(counts) > 1 and counts[0][1] > counts[1][1]:
        usual = counts[0][0]
        return tuple(r for r, v in values.items() if v != usual)
    return tuple(values)


def short_list(name: str, ranks: Sequence[int], fps: Sequence[Fingerprint], world: int) -> str:
    counts = {f.rank: f.count for f in fps}
    found = per_rank({r: str(counts[r]) for r in ranks})
    return f"{name} needs {world} entries for {world} ranks ({found})"


def first_spec(f: Fingerprint, which: str) -> TensorSpec:
    specs = f.inputs if which == "input" else f.outputs
    return specs[0] if specs else TensorSpec((), "")


def specs(specs: Sequence[TensorSpec]) -> str:
    if not specs:
        return "[]"
    if len(specs) == 1:
        return str(specs[0])
    if len(set(specs)) == 1:
        return f"[{specs[0]} x{len(specs)}]"
    return "[" + ", ".join(map(str, specs)) + "]"


def shape(shape: tuple[int, ...] | None) -> str:
    return "none" if shape is None else "[" + ", ".join(map(str, shape)) + "]"


def opt(value: int | None) -> str:
    return "None" if value is None else str(value)


def opt_list(values: tuple[int, ...] | None) -> str:
    return "even" if values is None else "[" + ", ".join(map(str, values)) + "]"
