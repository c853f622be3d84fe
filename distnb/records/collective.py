"""Records of collectives, shared by the ranks (which make them) and the kernel (which shows them).

Terms:

- **group**: a process group; `"WORLD"` or the name distnb gives a `new_group` (`"g1"`, ...).
- **seq**: the per-group sequence number of a collective, counted the same way on every member.
- **fingerprint**: what a rank is about to do at (group, seq): op, tensor specs, reduce op, root,
  peer, split sizes and call site. Ranks compare fingerprints before any data moves.

Records hold no tensors and import no torch: they cross processes as JSON-able dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CallSite:
    """Where a collective was called: a notebook cell and line, or a file and line."""

    file: str
    line: int
    cell: int | None = None
    code: str = ""

    def __str__(self) -> str:
        if self.cell is not None:
            return f"cell [{self.cell}] line {self.line}"
        return f"{self.file}:{self.line}"


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
