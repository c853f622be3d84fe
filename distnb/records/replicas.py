"""Replica checks: what each rank holds that its replicas should hold bit for bit, and what
differs.

A rank describes each tensor it was asked about as a `Digest` (name, shape, dtype, size, its
**replica group**: the ranks that should hold it identically, and a digest of its bits). The
kernel compares the digests of each group (`compare`, a pure function) and sizes only the
tensors whose digests differ. Records hold no tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from distnb.records.codec import Record

__all__ = [
    "Difference",
    "Digest",
    "ReplicaReport",
    "WatchReport",
    "bad_options",
    "compare",
    "first_divergence",
]


@dataclass(frozen=True, slots=True)
class Digest(Record):
    """One tensor on one rank. `group`: the ranks that should hold it identically (a DDP model's
    process group; a DTensor's ranks along its `Replicate` mesh dimensions; every rank for a
    plain tensor); `bits`: a position-mixed digest of its bytes (NaN differs from NaN with other
    bits, `-0.0` from `0.0`); `value` stands for a non-tensor (an optimizer's `lr`)."""

    name: str
    rank: int
    group: tuple[int, ...]
    bits: str
    shape: tuple[int, ...] = ()
    dtype: str = ""
    nbytes: int = 0
    value: str = ""


@dataclass(frozen=True, slots=True)
class Difference(Record):
    """A name whose replicas disagree: `agree` holds the groups of ranks that agree with each
    other, largest first; for tensors, the largest absolute and relative difference from the
    first group and where (`index`), when sized; `expected` is `"differ"` when identical
    replicas were the finding (data that should differ by rank)."""

    name: str
    agree: tuple[tuple[int, ...], ...]
    max_abs: float | None = None
    max_rel: float | None = None
    index: tuple[int, ...] = ()
    values: tuple[str, ...] = ()  # per group, for non-tensors
    expected: str = "same"

    @property
    def groups(self) -> str:
        """The groups of ranks that agree: `0,2 | 1,3`."""
        return " | ".join(",".join(map(str, g)) for g in self.agree)


@dataclass(frozen=True, slots=True)
class ReplicaReport(Record):
    """The answer to one replica check."""

    names: tuple[str, ...]
    ranks: tuple[int, ...]
    compared: int  # tensors (and values) compared across at least two ranks
    nbytes: int  # bytes digested, all ranks together
    differences: tuple[Difference, ...] = ()
    missing: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (name, ranks that lack it)
    alone: int = 0  # names whose replica groups are single ranks: nothing to compare (sharded)
    expect: str = "same"  # "differ": identical replicas are the finding (each rank's batch)
    within_atol: int = 0  # tensors that differ by no more than the tolerance given

    @property
    def agree(self) -> bool:
        return not self.differences and not self.missing


@dataclass(frozen=True, slots=True)
class WatchReport(Record):
    """What a watch saw: the steps it checked on every rank, and the first step at which replicas
    differed (None: they agreed throughout), with what differed then."""

    name: str
    ranks: tuple[int, ...]
    steps: tuple[int, ...]
    first: int | None = None
    differences: tuple[Difference, ...] = ()


def bad_options(atol: float, expect: str) -> str:
    """What is wrong with a check's options ("" if nothing)."""
    if expect not in ("same", "differ"):
        return f"expect is 'same' or 'differ', not {expect!r}"
    if atol < 0:
        return f"atol is a tolerance of 0 or more, not {atol}"
    return ""


def first_divergence(
    name: str, ranks: Sequence[int], history: Sequence[Sequence[tuple[int, Sequence[Digest]]]]
) -> WatchReport:
    """`history[i]`: rank `ranks[i]`'s (step, digests) records; steps every rank recorded are
    compared in order until one differs."""
    by_step = [dict((step, found) for step, found in records) for records in history]
    common = sorted(set.intersection(*(set(s) for s in by_step))) if by_step else []
    for step in common:
        differences, _, _, _ = compare([d for s in by_step for d in s[step]], ranks)
        if differences:
            return WatchReport(name, tuple(ranks), tuple(common), step, tuple(differences))
    return WatchReport(name, tuple(ranks), tuple(common))


def compare(
    digests: Sequence[Digest], ranks: Sequence[int], expect: str = "same"
) -> tuple[list[Difference], list[tuple[str, tuple[int, ...]]], int, int]:
    """Differences (unsized), names missing on some ranks, how many were compared and how many
    had no replica to compare with. `expect="differ"`: a name identical on two ranks of its group
    is the finding."""
    by_name: dict[str, list[Digest]] = {}
    for d in digests:
        by_name.setdefault(d.name, []).append(d)
    differences, missing = [], []
    compared = alone = 0
    for name, found in by_name.items():
        lacking = tuple(sorted(set(ranks) - {d.rank for d in found}))
        if lacking:
            missing.append((name, lacking))
        groups = sorted({d.group for d in found})
        alone += all(len(g) < 2 for g in groups)  # a shard on every rank: nothing to compare
        for group in groups:
            members = [d for d in found if d.group == group]
            if len(group) < 2:
                continue
            compared += 1
            agree = _agreeing(members)
            if expect == "same" and len(agree) > 1:
                values = tuple(_value_of(members, g) for g in agree) if members[0].value else ()
                differences.append(Difference(name, agree, values=values))
            elif expect == "differ" and any(len(g) > 1 for g in agree):
                differences.append(Difference(name, agree, expected="differ"))
    return differences, missing, compared, alone


def _agreeing(members: Sequence[Digest]) -> tuple[tuple[int, ...], ...]:
    groups: dict[tuple[str, str, tuple[int, ...], str], list[int]] = {}
    for d in sorted(members, key=lambda d: d.rank):
        groups.setdefault((d.bits, d.dtype, d.shape, d.value), []).append(d.rank)
    return tuple(tuple(g) for g in sorted(groups.values(), key=lambda g: (-len(g), g)))


def _value_of(members: Sequence[Digest], group: tuple[int, ...]) -> str:
    return next(d.value for d in members if d.rank == group[0])
