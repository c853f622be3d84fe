"""Records of collectives, shared by the ranks (which make them) and the kernel (which shows them).

Terms:

- **group**: a process group, named as the user knows it: `"WORLD"`, a `DeviceMesh` dimension
  (`"tp"`), the `group_desc` given to `new_group`, or its ranks (`"group[0,1]"`).
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
from dataclasses import dataclass, field
from enum import Enum

from distnb.records.codec import Ranks, Record

__all__ = [
    "CallSite",
    "CollectiveEvent",
    "Fingerprint",
    "MatchKind",
    "Mismatch",
    "Param",
    "TensorSpec",
]


@dataclass(frozen=True, slots=True)
class CallSite(Record):
    """Where a collective was called: a notebook cell and line, or a file and line."""

    file: str
    line: int
    cell: int | None = None
    code: str = ""

    def __str__(self) -> str:
        if self.cell is not None:
            return f"cell In[{self.cell}] line {self.line}"
        return f"{self.file}:{self.line}"


@dataclass(frozen=True, slots=True)
class CollectiveEvent(Record):
    """One collective as one rank saw it; the timeline's unit.

    Times are `time.monotonic_ns()`-style nanoseconds on the rank's clock (one shared clock on one
    host). `arrive_ns`: the rank entered the wrapper; `start_ns`: every peer had arrived (checks
    passed), data starts to move; `end_ns`: the op completed on this rank (for `async_op=True`,
    when its work finished or was waited on; 0 while unknown). `run_id`: the session's run (a
    cell, a script) it belongs to; `origin` the library code it came through (see `Fingerprint`).
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
    run_id: int | None = None
    group_size: int = 0
    origin: str = ""


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
    MODEL = "model"


@dataclass(frozen=True, slots=True)
class TensorSpec(Record):
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


@dataclass(frozen=True, slots=True)
class Param(Record):
    """One parameter of a model, by name: what DDP's constructor compares across ranks."""

    name: str
    spec: TensorSpec


@dataclass(frozen=True, slots=True)
class Fingerprint(Record):
    """What one rank is about to do at (group, seq); compared across ranks before data moves.

    `rank`, `root` and `peer` are global ranks. `inputs`/`outputs` are the tensors the call reads
    and writes, in argument order (`gather`'s output list is empty on ranks other than `dst`).
    `in_splits`/`out_splits` are `all_to_all_single`'s split sizes (None: even split). `count`
    is the list length of an object collective. `finite` is None unless `check_finite` is on.
    `origin` names the library code the call came through when the user did not make it
    themselves ("DDP gradient bucket 0 (fc.bias, fc.weight)", "compiled graph"); `params` is a
    DDP model's parameters, at its constructor's first collective.
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
    group_ranks: Ranks = ()
    site: CallSite = field(default_factory=lambda: CallSite("", 0))
    origin: str = ""
    params: tuple[Param, ...] = ()


@dataclass(frozen=True, slots=True)
class Mismatch(Record):
    """Ranks' fingerprints at (group, seq) that do not fit together.

    `fingerprints` holds one per rank, in rank order; `ranks` the ranks at fault where that can
    be told (the odd ones out, the ranks whose input was not finite), else every rank. `message`
    is the full text every rank raises; `hint` (also at the end of `message`) a likely cause.
    `held`: a check held the calls before they reached the backend (distnb's own ranks), or
    they went to it unchecked (an attached job's recorded calls).
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
    held: bool = True

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str | bytes) -> Mismatch:
        return cls.from_dict(json.loads(text))
