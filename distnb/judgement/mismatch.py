"""Building a `Mismatch`: the message every rank raises, one line per rank; from `GROUP_FROM`
ranks on, one line per call (`ranks 0-15,17-31: all_reduce(float32[8]) at ...`), so the odd
one out reads as a line of its own instead of one among 32."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from distnb.judgement.words import (
    canonical_op,
    describe,
    framework_call,
    framework_of,
    group_name,
)
from distnb.ranklist import GROUP_FROM, format_ranks, same_ranks
from distnb.records.collective import Fingerprint, MatchKind, Mismatch

SKIP_HINT = (
    "the ranks called different collectives from different lines: a rank may have skipped a "
    "collective (a branch on the rank, an early return) so that its next call met its peers' "
    "earlier one"
)

FRAMEWORK_HINT = (
    "{label} makes a collective: every rank calls it, as often as its peers (a call under "
    "`if rank == 0`, or on a step only some ranks run, leaves the others behind)"
)

LOOP_HINT = (
    "both calls come from {framework}'s own loop under the same line of yours: the ranks' loops "
    "went different ways, most often because their data loaders give different numbers of "
    "batches (shard the data with a DistributedSampler, as Lightning's "
    "use_distributed_sampler=True does, or drop_last=True)"
)

# (kind, detail, ranks at fault); ranks empty means "every rank"
Found = tuple[MatchKind, str, tuple[int, ...]]
Rule = Callable[[Sequence[Fingerprint]], "Found | None"]


UNCHECKED = (
    "These calls went to the backend unchecked (the job's checks are off): expect a hang, a "
    "crashed rank or wrong values from here on."
)


def aftermath(op: str, held: bool = True, deadlocked: bool = False) -> str:
    """What became of the calls: held by a check (nothing sent), or sent to the backend."""
    if not held:
        return UNCHECKED
    if canonical_op(op) in ("send", "recv") and not deadlocked:
        # the receiver takes the message into a scratch tensor, so the sender is not left hanging
        return "The message went to a scratch buffer, not yours; the process group still works."
    return "Nothing was sent; the process group still works."


def build_mismatch(
    fps: Sequence[Fingerprint],
    kind: MatchKind,
    detail: str,
    ranks: tuple[int, ...],
    deadlocked: bool = False,
    held: bool = True,
) -> Mismatch:
    """The `Mismatch` of `fps` (one per member, in rank order): its message names the kind and
    the call, has a line per rank (or per group of ranks that agree), a hint where one is likely,
    and says what became of the calls (`held`: a check held them; else they went to the backend).
    """
    first = fps[0]
    ops = list(dict.fromkeys(f.op for f in fps))
    op = "/".join(ops)
    hint = ""
    if kind is MatchKind.COLLECTIVE_TYPE and len({(f.site.file, f.site.line) for f in fps}) > 1:
        skip = framework_skip(fps)
        hint = FRAMEWORK_HINT.format(label=skip[0]) if skip else SKIP_HINT
    elif kind is MatchKind.COLLECTIVE_TYPE and len(frameworks := _frameworks(fps)) == 1:
        hint = LOOP_HINT.format(framework=frameworks.pop())
    if deadlocked:
        where = ""
    elif canonical_op(first.op) in ("send", "recv"):
        src, dst = fps[0].rank, fps[-1].rank
        if canonical_op(first.op) == "recv":
            src, dst = dst, src
        where = f"{op} #{first.seq} from rank {src} to rank {dst} on {group_name(first)}"
    else:
        where = f"{op} #{first.seq} on {group_name(first)}"
    origins = {f.origin for f in fps}
    if where and len(origins) == 1 and first.origin:
        where += f" ({first.origin})"  # the same library code on every rank: say it once
    lines = [f"{kind.value} mismatch{' in ' + where if where else ''}: {detail}"]
    calls = [describe(f) for f in fps]
    if len(origins) > 1 or deadlocked:
        calls = [f"{c} [{f.origin}]" if f.origin else c for f, c in zip(fps, calls, strict=True)]
    lines += rank_lines(fps, calls)
    if hint:
        lines.append(f"hint: {hint}")
    lines.append(aftermath(first.op, held, deadlocked))
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
        held=held,
    )


def framework_skip(fps: Sequence[Fingerprint]) -> tuple[str, str] | None:
    """When ranks split in two over which collective comes next and only one side's call is
    made by a framework's function, the other side skipped that function's collective, whatever
    made theirs: (the function's label, the sentence that says so)."""
    sides = same_ranks([(f.rank, (f.op, f.origin)) for f in fps])
    made = [side for side in sides if framework_call(side[1][1])]
    if len(sides) != 2 or len(made) != 1:
        return None
    callers, (op, label) = made[0]
    skippers, (their_op, their_origin) = next(side for side in sides if side is not made[0])
    theirs = f"{their_op} from {their_origin}" if their_origin else their_op
    said = f"{format_ranks(skippers)} skipped the {op} that {label} makes on "
    said += f"{format_ranks(callers)}; {'its' if len(skippers) == 1 else 'their'} call here is "
    return label, said + theirs


def _frameworks(fps: Sequence[Fingerprint]) -> set[str]:
    """The frameworks every call's origin names, when each names one."""
    names = {framework_of(f.origin) for f in fps}
    return set() if "" in names else names


def rank_lines(fps: Sequence[Fingerprint], calls: Sequence[str]) -> list[str]:
    """`  rank 1: all_reduce(float32[8], op=SUM)  at cell In[3] line 2: ...`, a line per rank,
    or per group of ranks that made the same call at the same place."""
    said = [
        (f.rank, (call, f"{f.site}: {f.site.code}" if f.site.code else str(f.site)))
        for f, call in zip(fps, calls, strict=True)
    ]
    grouped = len(fps) >= GROUP_FROM
    groups = same_ranks(said) if grouped else [([rank], what) for rank, what in said]
    heads = [f"{format_ranks(ranks)}:" for ranks, _ in groups]
    pad = max(map(len, heads)) if grouped else 0  # grouped labels vary in length: align calls
    width = max(len(call) for _, (call, _) in groups)
    return [
        f"  {head.ljust(pad)} {call.ljust(width)}  at {site}"
        for head, (_, (call, site)) in zip(heads, groups, strict=True)
    ]
