"""Records of a profiled run, shared by the ranks (which make them from `torch.profiler`) and the
kernel (which judges and shows them).

Terms:

- **span**: one interval a rank's profiler saw, kept as plain numbers: its name, its kind (what
  distnb makes of it, `SpanKind`), its thread and its start and end on the rank's monotonic clock
  (the clock `CollectiveEvent`s are stamped with), so spans and collectives line up.
- **window**: a cell (or script) the profiler recorded, from its start to its end on the rank;
  with a step limit, the last window ends at the step that reached it. Time between windows is
  distnb's own traffic and is never judged.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from distnb.records.codec import Record

__all__ = ["MOST_STEPS", "Profiled", "RankProfile", "Span", "SpanKind"]

# A profile asked without a step count ends after this many optimizer steps: the profiler keeps
# every event until it stops (about 0.3 MB a step of a small model's here: `bench_profile.py
# --part memory`), so a profile left on would grow without end. A step count given is kept.
MOST_STEPS = 200


class SpanKind(str, Enum):
    """What a span is to the breakdown; its value is the word views use."""

    OP = "op"  # an outermost torch op (aten::mm, autograd::engine::evaluate_function: ...)
    MODULE = "module"  # an nn.Module's forward ("nn.Module: Linear")
    DATA = "data"  # a DataLoader iterator's __next__
    OPTIMIZER = "optimizer"  # Optimizer.step / zero_grad
    COMM = "comm"  # the backend's collective op (c10d::allreduce_, gloo:all_reduce)
    DEVICE = "device"  # a GPU kernel or memcpy (CUDA runs only)


@dataclass(frozen=True, slots=True)
class Span(Record):
    """One interval of a rank's profile, on the rank's monotonic clock (ns)."""

    name: str
    kind: SpanKind
    start_ns: int
    end_ns: int
    thread: int = 0

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)


@dataclass(frozen=True, slots=True)
class RankProfile(Record):
    """What one rank's profiler recorded over a profiled run (or several cells).

    `windows`: the cells recorded, (start_ns, end_ns) on the rank's clock; `runs`: their run ids.
    `clock_precision_ns`: how far the profiler's clock, mapped onto the rank's, can be off (half
    the marker that maps it). `dropped`: spans left out past the rank's bound (the newest kept).
    `cost_ns`: what starting and reading the profiler cost the rank, outside the windows.
    `cpu`: (monotonic ns, its main thread's CPU ns) at each window's start and end and each
    optimizer step's end: how much of its time the thread had a CPU.
    """

    rank: int
    spans: tuple[Span, ...]
    windows: tuple[tuple[int, int], ...]
    runs: tuple[int, ...] = ()
    steps_limit: int | None = None
    clock_precision_ns: int = 0
    dropped: int = 0
    cost_ns: int = 0
    cpu: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Profiled(Record):
    """How an attached job's rank's profile stands (`distnb.rank.profiling.report`): `asked`
    (a profile was asked of this rank and not handed over yet), `steps` profiled so far of
    `limit` (None: until the notebook ends it), and `profile` once the profiler has stopped."""

    asked: bool
    steps: int = 0
    limit: int | None = None
    profile: RankProfile | None = None
