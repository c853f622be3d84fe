"""Rank lists as people read them: one spelling everywhere, `"ranks 0-2,5"` and `"rank 3"`,
read back by one grammar (`parse_ranks`), and ranks that say the same thing said once
(`same_ranks`).

A leaf module (it imports nothing of distnb), so records, matching, errors and views can all use
it without importing each other. At 32 ranks a message with a line per rank is 32 lines that say
the same thing: from `GROUP_FROM` ranks on, tables (`views/grouping.py`), mismatch messages, hang
reports and views give one line to the ranks that agree and one to each odd one out.

The grammar, for `--ranks`, the debugger's `ranks SELECTION COMMAND` and Python's `ranks=`:
ranks and ranges `0-3,6` (commas or spaces between them), `all` or `*`, anything
`format_ranks` prints (`rank 3`, `ranks 0-2,5`, `[ranks 0-7]`), and, at a debugger prompt,
a slice of the ranks' DeviceMesh `dp=1,tp=0:4` (end-exclusive, as Python's slices; the
debugger resolves it against each stopped rank's coordinates).
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeAlias, TypeVar

__all__ = [
    "GROUP_FROM",
    "RankArg",
    "RankSelection",
    "format_ranks",
    "parse_ranks",
    "rank_arg",
    "same_ranks",
]

GROUP_FROM = 9  # this many ranks or more are grouped (8 lines still read at a glance)

K = TypeVar("K", bound=Hashable)

RankArg: TypeAlias = Sequence[int] | str  # Python's `ranks=`: `[0, 2]` or `"0-3,6"`

MeshSlice: TypeAlias = tuple[str, int, int]  # (dimension, start, stop), stop exclusive

_WRITE = "write ranks as 0-3,6 or all"
_WRITE_MESH = "write ranks as 0-3,6, all, or a mesh slice dp=1"
_SPLIT = re.compile(r"\s*,\s*|\s+")
_SPAN = re.compile(r"(\d+)(?:-(\d+))?$")
_DIM = re.compile(r"([A-Za-z_]\w*)=(\d+)(?::(\d+))?$")
_EVERYONE = ("all", "*", "all ranks")


def format_ranks(ranks: Iterable[int], none: str = "no rank") -> str:
    """`[0, 1, 2, 5]` -> `"ranks 0-2,5"`; `[3]` -> `"rank 3"`; `[]` -> `none`."""
    ordered = sorted(set(ranks))
    if not ordered:
        return none
    if len(ordered) == 1:
        return f"rank {ordered[0]}"
    spans: list[str] = []
    start = prev = ordered[0]
    for r in [*ordered[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return "ranks " + ",".join(spans)


@dataclass(frozen=True, slots=True)
class RankSelection:
    """Which ranks a text names: all of them, these ranks (sorted, each once), or a slice of
    the DeviceMesh (dimension, start, stop: stop exclusive). `str` writes it back."""

    everyone: bool = False
    ranks: tuple[int, ...] = ()
    mesh: tuple[MeshSlice, ...] = ()

    def __str__(self) -> str:
        if self.everyone:
            return "all"
        if self.ranks:
            return format_ranks(self.ranks)
        return ",".join(_dim(d, a, b) for d, a, b in self.mesh)


def _dim(name: str, start: int, stop: int) -> str:
    return f"{name}={start}" if stop == start + 1 else f"{name}={start}:{stop}"


def parse_ranks(text: str, world: int | None = None, *, mesh: bool = True) -> RankSelection:
    """The ranks `text` names; ValueError, saying what to write, for text that does not read,
    a range that goes down, a negative rank or (given `world`) a rank past the last.

    >>> parse_ranks("0-2,5")
    RankSelection(everyone=False, ranks=(0, 1, 2, 5), mesh=())
    >>> parse_ranks(format_ranks([0, 1, 2, 5])) == parse_ranks("0-2,5")
    True
    >>> parse_ranks("dp=1,tp=0:4").mesh
    (('dp', 1, 2), ('tp', 0, 4))

    `mesh=False` refuses mesh slices (where no mesh is at hand to resolve them).
    """
    write = _WRITE_MESH if mesh else _WRITE
    body = _body(text)
    if body.lower() in _EVERYONE:
        return RankSelection(everyone=True)
    if not body or body == "no rank":
        raise ValueError(f"{text!r} names no rank: {write}")
    parts = _SPLIT.split(body)
    if "" in parts:
        raise ValueError(f"{text!r} has a comma with no rank on one side: {write}")
    slices = [p for p in parts if "=" in p]
    if not slices:
        return RankSelection(ranks=_ranks(parts, world, write))
    if not mesh:
        raise ValueError(
            f"{text!r} is a mesh slice, which picks stopped ranks at a debugger prompt "
            f"(`ranks dp=1 p x`); {_WRITE}"
        )
    if len(slices) < len(parts):
        raise ValueError(f"{text!r} mixes ranks and a mesh slice: write 0-3,6 or dp=1,tp=0:4")
    return RankSelection(mesh=_dims(parts))


def _body(text: str) -> str:
    """`text` without what `format_ranks` and labels put around ranks: `[ranks 0-2]` -> `0-2`."""
    body = text.strip()
    if body.startswith("[") and body.endswith("]"):
        body = body[1:-1].strip()
    word, _, rest = body.partition(" ")
    return rest.strip() if word in ("rank", "ranks") else body


def _ranks(parts: list[str], world: int | None, write: str) -> tuple[int, ...]:
    ranks: set[int] = set()
    for part in parts:
        span = _SPAN.match(part)
        if span is None:
            raise ValueError(_not_a_rank(part, world, write))
        first, last = int(span.group(1)), int(span.group(2) or span.group(1))
        if last < first:
            raise ValueError(f"{part!r}: a range goes up (e.g. 0-3); write {last}-{first}")
        if world is not None and last >= world:
            raise ValueError(f"{part!r}: no rank {last}; the ranks are {_allowed(world)}")
        ranks.update(range(first, last + 1))
    return tuple(sorted(ranks))


def _not_a_rank(part: str, world: int | None, write: str) -> str:
    if re.match(r"-\d", part):
        allowed = _allowed(world) if world is not None else "0, 1, 2, ..."
        return f"{part!r}: a rank is 0 or more (the ranks are {allowed}); {write}"
    return f"{part!r} is not a rank or a range of ranks: {write}"


def _allowed(world: int) -> str:
    return "0 alone" if world == 1 else f"0 to {world - 1}"


def _dims(parts: list[str]) -> tuple[MeshSlice, ...]:
    dims: dict[str, MeshSlice] = {}
    for part in parts:
        dim = _DIM.match(part)
        if dim is None:
            raise ValueError(
                f"{part!r} is not a mesh slice such as dp=1 or tp=0:4 (stop exclusive)"
            )
        name, start = dim.group(1), int(dim.group(2))
        stop = int(dim.group(3)) if dim.group(3) is not None else start + 1
        if stop <= start:
            raise ValueError(
                f"{part!r}: the slice is empty (stop is exclusive): {name}=0:4 is {name} 0 to 3"
            )
        if name in dims:
            raise ValueError(f"{part!r}: {name} is sliced twice; write one slice per dimension")
        dims[name] = (name, start, stop)
    return tuple(dims.values())


def rank_arg(ranks: RankArg | None, world: int | None = None) -> list[int] | None:
    """Python's `ranks=` as a list: a string read as `parse_ranks` reads it (`"0-3,6"`,
    `"ranks 0-1"`); None, `"all"` and `"*"` are every rank (None). ValueError as `parse_ranks`.

    >>> rank_arg("0-1,3"), rank_arg([2, 0]), rank_arg("all")
    ([0, 1, 3], [2, 0], None)
    """
    if ranks is None or not isinstance(ranks, str):
        return None if ranks is None else list(ranks)
    spec = parse_ranks(ranks, world, mesh=False)
    return None if spec.everyone else list(spec.ranks)


def same_ranks(keyed: Iterable[tuple[int, K]]) -> list[tuple[list[int], K]]:
    """(rank, what it says) pairs -> (ranks that say it, what), in the order of each first rank.

    >>> same_ranks([(0, "a"), (1, "b"), (2, "a")])
    [([0, 2], 'a'), ([1], 'b')]
    """
    groups: dict[K, list[int]] = {}
    for rank, key in keyed:
        groups.setdefault(key, []).append(rank)
    return [(ranks, key) for key, ranks in groups.items()]
