"""Records of collectives, shared by the ranks (which make them) and the kernel (which shows them).

Terms:

- **group**: a process group; `"WORLD"` or the name distnb gives a `new_group` (`"g1"`, ...).
- **seq**: the per-group sequence number of a collective, counted the same way on every member.
  Point-to-point messages are counted per channel (group, source, destination, tag) instead.
- **fingerprint**: what a rank is about to do at (group, seq): op, tensor specs, reduce op, root,
  peer, split sizes and call site. Ranks compare fingerprints before any data moves.
- **mismatch**: the verdict when fingerprints do not fit together: its kind, every rank's
  fingerprint and the message that every rank raises.

Records hold no tensors and import no torch: they cross processes as JSON-able dataclasses
(`to_dict()` / `from_dict()`; `Mismatch` also has `to_json()` / `from_json()`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

__all__ = [
    "CallSite",
    "CollectiveEvent",
    "Fingerprint",
    "MatchKind",
    "Mismatch",
    "TensorSpec",
]


@dataclass(frozen=True, slots=True)
class CallSite:
    """Where a collective was called: a notebook cell and line, or a file and line."""

    file: str
    line: int
    cell: int | None = None
    code: str = ""

    def __str__(self) -> str:
        if self.cell is not None:
            return f"cell In[{self.cell}] line {self.line}"
        return f"{self.file}:{self.line}"

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "cell": self.cell, "code": self.code}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CallSite:
        return cls(str(d["file"]), int(d["line"]), _opt_int(d.get("cell")), str(d.get("code", "")))


@dataclass(frozen=True, slots=True)
class CollectiveEvent:
    """One collective as one rank saw it; the timeline's unit.

    Times are `time.monotonic_ns()`-style nanoseconds on the rank's clock (one shared clock on one
    host). `arrive_ns`: the rank entered the wrapper; `start_ns`: every peer had arrived (checks
    passed), data starts to move; `end_ns`: the op completed on this rank (for `async_op=True`,
    when its work finished or was waited on; 0 while unknown).
    """

    rank: int
    group: str
    seq: int
    op: str
    nbytes: int
    site: CallSite
    arrive_ns: int
    start_ns: int
    end_ns: int
    cell: int | None = None
    group_size: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "group": self.group,
            "seq": self.seq,
            "op": self.op,
            "nbytes": self.nbytes,
            "site": self.site.to_dict(),
            "arrive_ns": self.arrive_ns,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "cell": self.cell,
            "group_size": self.group_size,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CollectiveEvent:
        return cls(
            rank=int(d["rank"]),
            group=str(d["group"]),
            seq=int(d["seq"]),
            op=str(d["op"]),
            nbytes=int(d["nbytes"]),
            site=CallSite.from_dict(d["site"]),
            arrive_ns=int(d["arrive_ns"]),
            start_ns=int(d["start_ns"]),
            end_ns=int(d["end_ns"]),
            cell=_opt_int(d.get("cell")),
            group_size=int(d.get("group_size", 0)),
        )


class MatchKind(str, Enum):
    """Why fingerprints do not fit together; after PyTorch flight recorder's `MatchState`.

    The values are the words the messages use ("shape mismatch in all_reduce #3 ...").
    """

    COLLECTIVE_TYPE = "op type"
    SHAPE = "shape"
    DTYPE = "dtype"
    DEVICE = "device"
    REDUCE_OP = "reduce op"
    ROOT = "root"
    PEER = "peer"
    SPLIT_SIZES = "split sizes"
    GROUP = "group"
    COUNT = "count"
    NON_FINITE = "non-finite input"


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A tensor's shape, dtype (`"float32"`) and device type (`"cpu"`, `"cuda"`), without data."""

    shape: tuple[int, ...]
    dtype: str
    device: str = "cpu"

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def __str__(self) -> str:
        dims = ", ".join(map(str, self.shape))
        where = "" if self.device == "cpu" else f" on {self.device}"
        return f"{self.dtype}[{dims}]{where}"

    def to_dict(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype, "device": self.device}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TensorSpec:
        return cls(tuple(int(x) for x in d["shape"]), str(d["dtype"]), str(d.get("device", "cpu")))


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """What one rank is about to do at (group, seq); compared across ranks before data moves.

    `rank`, `root` and `peer` are global ranks. `inputs`/`outputs` are the tensors the call reads
    and writes, in argument order (`gather`'s output list is empty on ranks other than `dst`).
    `in_splits`/`out_splits` are `all_to_all_single`'s split sizes (None: even split). `count`
    is the list length of an object collective. `finite` is None unless `check_finite` is on.
    """

    rank: int
    group: str
    seq: int
    op: str
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    reduce_op: str = ""
    root: int | None = None
    peer: int | None = None
    in_splits: tuple[int, ...] | None = None
    out_splits: tuple[int, ...] | None = None
    count: int | None = None
    finite: bool | None = None
    tag: int = 0
    group_ranks: tuple[int, ...] = ()
    site: CallSite = field(default_factory=lambda: CallSite("", 0))

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "group": self.group,
            "seq": self.seq,
            "op": self.op,
            "inputs": [s.to_dict() for s in self.inputs],
            "outputs": [s.to_dict() for s in self.outputs],
            "reduce_op": self.reduce_op,
            "root": self.root,
            "peer": self.peer,
            "in_splits": None if self.in_splits is None else list(self.in_splits),
            "out_splits": None if self.out_splits is None else list(self.out_splits),
            "count": self.count,
            "finite": self.finite,
            "tag": self.tag,
            "group_ranks": list(self.group_ranks),
            "site": self.site.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Fingerprint:
        return cls(
            rank=int(d["rank"]),
            group=str(d["group"]),
            seq=int(d["seq"]),
            op=str(d["op"]),
            inputs=tuple(TensorSpec.from_dict(s) for s in d.get("inputs", ())),
            outputs=tuple(TensorSpec.from_dict(s) for s in d.get("outputs", ())),
            reduce_op=str(d.get("reduce_op", "")),
            root=_opt_int(d.get("root")),
            peer=_opt_int(d.get("peer")),
            in_splits=_opt_ints(d.get("in_splits")),
            out_splits=_opt_ints(d.get("out_splits")),
            count=_opt_int(d.get("count")),
            finite=None if d.get("finite") is None else bool(d["finite"]),
            tag=int(d.get("tag", 0)),
            group_ranks=tuple(int(r) for r in d.get("group_ranks", ())),
            site=CallSite.from_dict(d["site"]) if "site" in d else CallSite("", 0),
        )


@dataclass(frozen=True, slots=True)
class Mismatch:
    """Ranks' fingerprints at (group, seq) that do not fit together.

    `fingerprints` holds one per rank, in rank order; `ranks` the ranks at fault where that can
    be told (the odd ones out, the ranks whose input was not finite), else every rank. `message`
    is the full text every rank raises; `hint` (also at the end of `message`) a likely cause.
    """

    kind: MatchKind
    op: str
    group: str
    seq: int
    fingerprints: tuple[Fingerprint, ...]
    message: str
    detail: str = ""
    ranks: tuple[int, ...] = ()
    hint: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "op": self.op,
            "group": self.group,
            "seq": self.seq,
            "fingerprints": [fp.to_dict() for fp in self.fingerprints],
            "message": self.message,
            "detail": self.detail,
            "ranks": list(self.ranks),
            "hint": self.hint,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Mismatch:
        return cls(
            kind=MatchKind(d["kind"]),
            op=str(d["op"]),
            group=str(d["group"]),
            seq=int(d["seq"]),
            fingerprints=tuple(Fingerprint.from_dict(f) for f in d["fingerprints"]),
            message=str(d["message"]),
            detail=str(d.get("detail", "")),
            ranks=tuple(int(r) for r in d.get("ranks", ())),
            hint=str(d.get("hint", "")),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str | bytes) -> Mismatch:
        return cls.from_dict(json.loads(text))


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _opt_ints(value: Sequence[Any] | None) -> tuple[int, ...] | None:
    return None if value is None else tuple(int(x) for x in value)
