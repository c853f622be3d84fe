"""Who is slow, and why: each rank's time per step split into phases, and the straggler named with
the phase and the module or op that makes it late. Pure: records in, records out.

Input: each rank's profile (`RankProfile`: spans of `torch.profiler` on the rank's clock, the
cells recorded) and its collectives (`CollectiveEvent`s: arrival, start and end), with per-rank
clock offsets where ranks sit on several hosts (the timeline's `ClockOffsets`).

**Steps** are found in this order, the first that every rank has: *optimizer steps* (each ends
where an `Optimizer.step` ends, the first starts with its cell; what follows the last step of a
cell is left out), *DataLoader iterations* (from one `__next__` to the next; the last call, the
one that ends the loop, starts the left-out tail), else each *cell* is one step.

**Phases** of a step, each instant counted once, in this order of precedence:

    waiting for peers   a collective's arrival to its start: the rank waits for the last peer
    collectives         a collective's start to its end, and the backend's own ops
    data loading        a DataLoader iterator's __next__ (the Dataset's __getitem__, collate)
    optimizer step      Optimizer.step and zero_grad
    compute             torch ops and modules' forward, outside the phases above
    other host time     the rest of the step: Python between ops, sleeps, I/O

A straggler whose compute is late because its **ops** run slower, while its main thread had no
more CPU time per step than its peers' (the thread's CPU clock, read at each step), did the same
work with less of a CPU: something else runs on its cores, and the verdict says so.

**Overlap**: the share of a rank's collective time (a collective's start to its end, on the
backend's thread) during which its own torch ops ran (DDP's gradient all_reduce beside the rest
of the backward), as HTA's "comm/compute overlap"; a module's span is not compute for it (a
forward that waits in a blocking collective is not overlapping it).

Times per step are **medians** over the steps, so that a cell's first step, which makes the model,
the iterator or the process group, does not count as the typical one.

**The straggler** is the rank whose time outside waiting and collectives ("busy") per step is the
greatest; it is late by that time less the median of its peers'. It is named when late by more
than `max(0.5 ms, 5% of a step)` and the clocks' precision. Its **cause** is the phase whose time
per step exceeds its peers' median the most, and inside that phase the DataLoader, optimizer,
module or op whose time does (a module is preferred to the ops it runs, when it explains most of
the difference). A module's time is its forward and the backward of the ops its forward ran
(`distnb.rank.profiling` links them by autograd's sequence numbers); modules are named by class.
"""

from __future__ import annotations

import statistics
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from itertools import pairwise

from distnb.records.collective import CollectiveEvent
from distnb.records.profiling import RankProfile, Span, SpanKind

__all__ = [
    "Breakdown",
    "Phase",
    "RankBreakdown",
    "StepTime",
    "Straggler",
    "breakdown",
    "label",
]

Interval = tuple[int, int]
MIN_LATE_NS = 500_000
MIN_LATE_SHARE = 0.05
MODULE_SHARE = 0.8  # a module explaining this share of the best op's difference is named instead
NAMED_SHARE = 0.8  # a name explaining less of its phase's difference is said with the phase
STARVED_OPS, STARVED_CPU = 1.3, 1.15  # ops this much slower, on at most this much more CPU


class Phase(str, Enum):
    """A part of a step; its value is the word the views use."""

    COMPUTE = "compute"
    COLLECTIVE = "collectives"
    WAIT = "waiting for peers"
    DATA = "data loading"
    OPTIMIZER = "optimizer step"
    OTHER = "other host time"


PRECEDENCE = (Phase.WAIT, Phase.COLLECTIVE, Phase.DATA, Phase.OPTIMIZER, Phase.COMPUTE)
_KIND_PHASE = {
    SpanKind.COMM: Phase.COLLECTIVE,
    SpanKind.DATA: Phase.DATA,
    SpanKind.OPTIMIZER: Phase.OPTIMIZER,
    SpanKind.OP: Phase.COMPUTE,
    SpanKind.MODULE: Phase.COMPUTE,
    SpanKind.DEVICE: Phase.COMPUTE,
}
_BUSY = (Phase.COMPUTE, Phase.DATA, Phase.OPTIMIZER, Phase.OTHER)


@dataclass(frozen=True, slots=True)
class StepTime:
    """One step of one rank: its bounds on the reference clock, ns per phase, and ns per named
    DataLoader, optimizer, module or op (keys as `label` writes them)."""

    rank: int
    index: int
    start_ns: int
    end_ns: int
    phases: Mapping[Phase, int]
    names: Mapping[str, int] = field(default_factory=dict)
    comm_ns: int = 0  # its collectives' time, start to end, whatever else ran meanwhile
    overlap_ns: int = 0  # ... of which its torch ops ran beside them (module doc)
    cpu_ns: int = 0  # its main thread's CPU time (0: not measured)

    @property
    def ops_ns(self) -> int:
        """Its torch ops' time (not their modules')."""
        return sum(ns for name, ns in self.names.items() if name.startswith("op:"))

    @property
    def busy_ns(self) -> int:
        """Time not spent waiting for peers or moving data between ranks."""
        return sum(self.phases.get(p, 0) for p in _BUSY)


_Of = Callable[[StepTime], float]  # a step's time in one phase, or under one name


@dataclass(frozen=True, slots=True)
class RankBreakdown:
    """A rank's steps, and its median time per step in each phase."""

    rank: int
    steps: tuple[StepTime, ...]

    def per_step(self, phase: Phase) -> float:
        return _median(s.phases.get(phase, 0) for s in self.steps)

    @property
    def step_ns(self) -> float:
        return _median(s.end_ns - s.start_ns for s in self.steps)

    @property
    def overlap(self) -> float | None:
        """The share of its collectives' time its ops ran beside them (None: no collective)."""
        comm = sum(s.comm_ns for s in self.steps)
        return sum(s.overlap_ns for s in self.steps) / comm if comm else None


@dataclass(frozen=True, slots=True)
class Straggler:
    """The slow rank, how late it is per step, and the cause: `phase`, and `what` in it (a label,
    or "" when no one name stands out), its time per step against its peers' median."""

    rank: int
    late_ns: float
    unit: str  # "step" or "cell"
    phase: Phase
    what: str
    mine_ns: float
    peers_ns: float
    phase_mine_ns: float = 0.0  # the phase's own times, when `what` explains only part of it
    phase_peers_ns: float = 0.0
    # its ops slower with no more CPU time than its peers': its main thread's CPU per step,
    # and its peers' median (0: not so)
    cpu_mine_ns: float = 0.0
    cpu_peers_ns: float = 0.0

    def __str__(self) -> str:
        said = self._said()
        if not self.cpu_mine_ns:
            return said
        return (
            f"{said}; its ops ran slower with no more CPU time than the others' "
            f"({_ms(self.cpu_mine_ns)} against {_ms(self.cpu_peers_ns)} per {self.unit}): "
            "something else runs on its cores"
        )

    def _said(self) -> str:
        late = f"rank {self.rank} is {_ms(self.late_ns)} late per {self.unit}"
        cause = _cause_words(self.phase, self.what)
        against = f"{_ms(self.mine_ns)} against {_ms(self.peers_ns)}"
        whole = self.phase_mine_ns - self.phase_peers_ns
        if not self.what or whole <= 0 or self.mine_ns - self.peers_ns >= NAMED_SHARE * whole:
            return f"{late}: {cause} takes {against} on the others"
        phase = f"{_ms(self.phase_mine_ns)} against {_ms(self.phase_peers_ns)}"
        return (
            f"{late}: its {self.phase.value} takes {phase} on the others, the most of it in "
            f"{cause.removeprefix('its ')}: {against}"
        )


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Every rank's steps and phases, how steps were found, and the straggler if one stands out
    (`verdict` says so in words either way)."""

    ranks: tuple[RankBreakdown, ...]
    steps_by: str  # "optimizer steps", "DataLoader iterations" or "cells"
    straggler: Straggler | None
    verdict: str

    @property
    def unit(self) -> str:
        return "cell" if self.steps_by == "cells" else "step"


def breakdown(
    profiles: Sequence[RankProfile],
    events: Iterable[CollectiveEvent] = (),
    offsets: Mapping[int, int] | None = None,
    precision_ns: int = 0,
) -> Breakdown:
    """Split each rank's profiled time into steps and phases and name the straggler (module doc).

    `offsets[rank]` is added to the rank's times (its clock onto the reference one).

    >>> b = breakdown(profiles, events)
    >>> str(b.straggler)
    "rank 1 is 41.0 ms late per step: its DataLoader's next() takes 52.0 ms against 9.0 ms ..."
    """
    offsets = offsets or {}
    by_rank: dict[int, list[CollectiveEvent]] = defaultdict(list)
    for e in events:
        by_rank[e.rank].append(e)
    profiles = sorted(profiles, key=lambda p: p.rank)
    steps_by = _steps_by(profiles)
    ranks = tuple(
        _rank_breakdown(p, by_rank.get(p.rank, []), offsets.get(p.rank, 0), steps_by)
        for p in profiles
    )
    precision = max([precision_ns, *(p.clock_precision_ns for p in profiles)])
    straggler = find_straggler(ranks, "cell" if steps_by == "cells" else "step", precision)
    return Breakdown(ranks, steps_by, straggler, _verdict(ranks, straggler, steps_by))


def label(span: Span) -> str:
    """The name a span counts under in a step's `names`: `kind: short name`."""
    name = span.name
    if span.kind is SpanKind.DATA:
        name = "DataLoader"
    elif span.kind is SpanKind.OPTIMIZER:
        name = name.rpartition("#")[2] or name  # Optimizer.step#SGD.step -> SGD.step
    elif span.kind is SpanKind.MODULE:  # forward and backward count as one
        name = name.removeprefix("nn.Module: ").removesuffix(" (backward)")
    return f"{span.kind.value}: {name}"


# --- steps ---------------------------------------------------------------------------------


def _is_step(span: Span) -> bool:
    return span.kind is SpanKind.OPTIMIZER and span.name.startswith("Optimizer.step")


def _steps_by(profiles: Sequence[RankProfile]) -> str:
    if profiles and all(any(map(_is_step, p.spans)) for p in profiles):
        return "optimizer steps"
    if profiles and all(any(s.kind is SpanKind.DATA for s in p.spans) for p in profiles):
        return "DataLoader iterations"
    return "cells"


def step_bounds(profile: RankProfile, steps_by: str) -> list[Interval]:
    """The rank's steps on its own clock, found as `steps_by` says (module doc)."""
    out: list[Interval] = []
    spans = sorted(profile.spans, key=lambda s: s.start_ns)
    starts = [s.start_ns for s in spans]
    for w0, w1 in profile.windows:
        # a span that starts inside the window counts: a step limit cuts the window inside the
        # last step (its optimizer's post-hook), before that step's span ends
        inside = spans[bisect_left(starts, w0) : bisect_right(starts, w1)]
        if steps_by == "optimizer steps":
            ends = sorted(s.end_ns for s in inside if _is_step(s))
            out += list(zip([w0, *ends], ends))
        elif steps_by == "DataLoader iterations":
            starts = sorted(s.start_ns for s in inside if s.kind is SpanKind.DATA)
            out += list(pairwise(starts))
        else:
            out.append((w0, w1))
    return out


# --- phases --------------------------------------------------------------------------------


def _rank_breakdown(
    profile: RankProfile, events: Sequence[CollectiveEvent], offset: int, steps_by: str
) -> RankBreakdown:
    spans = list(profile.spans)
    phase_sets: dict[Phase, list[Interval]] = defaultdict(list)
    for e in events:
        if e.start_ns > e.arrive_ns:
            phase_sets[Phase.WAIT].append((e.arrive_ns, e.start_ns))
        if e.end_ns > e.start_ns:
            phase_sets[Phase.COLLECTIVE].append((e.start_ns, e.end_ns))
    for s in spans:
        phase_sets[_KIND_PHASE[s.kind]].append((s.start_ns, s.end_ns))
    # each instant belongs to the first phase (in PRECEDENCE) that covers it
    taken: list[Interval] = []
    exclusive: dict[Phase, list[Interval]] = {}
    for phase in PRECEDENCE:
        own = union(phase_sets.get(phase, []))
        exclusive[phase] = subtract(own, taken)
        taken = union(taken + own)
    comm = union((e.start_ns, e.end_ns) for e in events)
    ops = union((s.start_ns, s.end_ns) for s in spans if s.kind in (SpanKind.OP, SpanKind.DEVICE))
    overlapped = intersect(comm, ops)
    bounds = step_bounds(profile, steps_by)
    names = _names_per_step(spans, bounds)
    steps = []
    for i, (a, b) in enumerate(bounds):
        phases = {p: length(clip(exclusive[p], a, b)) for p in PRECEDENCE}
        phases[Phase.OTHER] = max(0, (b - a) - sum(phases.values()))
        both = length(clip(comm, a, b)), length(clip(overlapped, a, b))
        cpu = _cpu_at(profile.cpu, b) - _cpu_at(profile.cpu, a)
        step = StepTime(profile.rank, i, a + offset, b + offset, phases, names[i], *both, cpu)
        steps.append(step)
    return RankBreakdown(profile.rank, tuple(steps))


def _names_per_step(spans: Sequence[Span], bounds: Sequence[Interval]) -> list[dict[str, int]]:
    """Each step's ns per `label`: every span but the backend's ops, as far as it overlaps the
    step. Steps follow one another (`step_bounds`), so each span meets only the steps found
    from its start by bisection, not all of them: linear in spans and steps."""
    out: list[dict[str, int]] = [defaultdict(int) for _ in bounds]
    ends = [b for _, b in bounds]
    ordered = all(b0 <= a1 for (_, b0), (a1, _) in pairwise(bounds))
    labels: dict[tuple[str, SpanKind], str] = {}
    for s in spans:
        if s.kind is SpanKind.COMM:
            continue
        key = (s.name, s.kind)
        name = labels.get(key) or labels.setdefault(key, label(s))
        j = bisect_right(ends, s.start_ns) if ordered else 0
        while j < len(bounds) and (bounds[j][0] < s.end_ns or not ordered):
            a, b = bounds[j]
            overlap = min(s.end_ns, b) - max(s.start_ns, a)
            if overlap > 0:
                out[j][name] += overlap
            j += 1
    return [dict(n) for n in out]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same instants."""
    out: list[Interval] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def subtract(intervals: Sequence[Interval], taken: Sequence[Interval]) -> list[Interval]:
    """The instants of `intervals` (disjoint, sorted) outside `taken` (disjoint, sorted)."""
    out: list[Interval] = []
    j = 0
    for a, b in intervals:
        while j < len(taken) and taken[j][1] <= a:
            j += 1
        k, cur = j, a
        while k < len(taken) and taken[k][0] < b:
            if taken[k][0] > cur:
                out.append((cur, taken[k][0]))
            cur = max(cur, taken[k][1])
            k += 1
        if cur < b:
            out.append((cur, b))
    return out


def clip(intervals: Sequence[Interval], a: int, b: int) -> list[Interval]:
    """The part of `intervals` (disjoint, sorted) inside [a, b), found by bisection."""
    out = []
    for x, y in intervals[max(0, bisect_right(intervals, (a, a)) - 1) :]:
        if x >= b:
            break
        if y > a:
            out.append((max(x, a), min(y, b)))
    return out


def _cpu_at(samples: Sequence[tuple[int, int]], t: int) -> int:
    """The main thread's CPU ns at instant `t`, between the samples around it (0: none)."""
    if not samples:
        return 0
    i = bisect_right(samples, (t, 1 << 62))
    if i == 0:
        return samples[0][1]
    if i == len(samples):
        return samples[-1][1]
    (t0, c0), (t1, c1) = samples[i - 1], samples[i]
    return c0 + (c1 - c0) * (t - t0) // max(1, t1 - t0)


def intersect(xs: Sequence[Interval], ys: Sequence[Interval]) -> list[Interval]:
    """The instants in both `xs` and `ys` (each disjoint and sorted)."""
    out: list[Interval] = []
    i = j = 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if a < b:
            out.append((a, b))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def length(intervals: Iterable[Interval]) -> int:
    return sum(b - a for a, b in intervals)


# --- the straggler -------------------------------------------------------------------------


def find_straggler(
    ranks: Sequence[RankBreakdown], unit: str = "step", precision_ns: int = 0
) -> Straggler | None:
    """The rank busiest per step when it stands out from its peers (module doc), or None."""
    ranks = [r for r in ranks if r.steps]
    if len(ranks) < 2:
        return None
    n = min(len(r.steps) for r in ranks)
    busy = {r.rank: _median(s.busy_ns for s in r.steps[:n]) for r in ranks}
    slow = max(busy, key=lambda r: busy[r])
    late = busy[slow] - statistics.median(v for r, v in busy.items() if r != slow)
    step = statistics.median(_median(s.end_ns - s.start_ns for s in r.steps[:n]) for r in ranks)
    if late < max(MIN_LATE_NS, MIN_LATE_SHARE * step, 2 * precision_ns):
        return None
    mine = next(r for r in ranks if r.rank == slow).steps[:n]
    peers = [r.steps[:n] for r in ranks if r.rank != slow]
    phase = max(_BUSY, key=lambda p: _excess(mine, peers, lambda s: s.phases.get(p, 0))[0])
    what, mine_ns, peers_ns = _culprit(phase, mine, peers)
    _, phase_mine, phase_peers = _excess(mine, peers, lambda s: s.phases.get(phase, 0))
    cpu = _starved(mine, peers) if phase is Phase.COMPUTE else (0.0, 0.0)
    return Straggler(
        slow, late, unit, phase, what, mine_ns, peers_ns, phase_mine, phase_peers, *cpu
    )


def _starved(mine: Sequence[StepTime], peers: Sequence[Sequence[StepTime]]) -> tuple[float, float]:
    """(its CPU per step, its peers' median) when its ops took `STARVED_OPS` times its peers'
    with at most `STARVED_CPU` times their CPU time: the same work, less of a CPU (its cores
    shared); else (0, 0). Sleeps and waits inside modules slow no op, and take no CPU."""
    if not all(s.cpu_ns for s in mine) or not all(s.cpu_ns for p in peers for s in p):
        return 0.0, 0.0
    _, ops_mine, ops_peers = _excess(mine, peers, lambda s: s.ops_ns)
    _, cpu_mine, cpu_peers = _excess(mine, peers, lambda s: s.cpu_ns)
    if ops_mine >= STARVED_OPS * ops_peers and cpu_mine <= STARVED_CPU * cpu_peers:
        return cpu_mine, cpu_peers
    return 0.0, 0.0


def _excess(
    mine: Sequence[StepTime], peers: Sequence[Sequence[StepTime]], of: _Of
) -> tuple[float, float, float]:
    """(mine - peers' median, mine, peers' median), per step."""
    own = _median(of(s) for s in mine)
    theirs = statistics.median(_median(of(s) for s in p) for p in peers)
    return own - theirs, own, theirs


def _culprit(
    phase: Phase, mine: Sequence[StepTime], peers: Sequence[Sequence[StepTime]]
) -> tuple[str, float, float]:
    """The name inside `phase` whose time per step exceeds the peers' most, with both times;
    the phase's own times when no name does (other host time has no names)."""
    kinds = {
        Phase.DATA: ("data",),
        Phase.OPTIMIZER: ("optimizer",),
        Phase.COMPUTE: ("module", "op", "device"),
    }.get(phase, ())
    names = {n for s in [*mine, *(s for p in peers for s in p)] for n in s.names}
    names = {n for n in names if n.partition(":")[0] in kinds}
    scored = {n: _excess(mine, peers, _name_of(n)) for n in names}
    whole = _excess(mine, peers, lambda s: s.phases.get(phase, 0))
    if not scored:
        return "", whole[1], whole[2]
    best = max(scored, key=lambda n: scored[n][0])
    modules = [n for n in scored if n.startswith("module:")]
    close = [n for n in modules if scored[n][0] >= MODULE_SHARE * scored[best][0]]
    if close and not best.startswith("module:"):
        best = min(close, key=lambda n: scored[n][1])  # the innermost: the least time of its own
    elif best.startswith("module:"):
        near = [n for n in modules if scored[n][0] >= MODULE_SHARE * scored[best][0]]
        best = min(near, key=lambda n: scored[n][1])
    if scored[best][0] <= 0:
        return "", whole[1], whole[2]
    return best, scored[best][1], scored[best][2]


def _name_of(name: str) -> _Of:
    return lambda s: s.names.get(name, 0)


def _cause_words(phase: Phase, what: str) -> str:
    kind, _, name = what.partition(": ")
    if kind == "data":
        return "its DataLoader's next()"
    if kind == "optimizer":
        return f"its optimizer's step ({name})"
    if kind == "module":
        return f"its module {name}"
    if kind in ("op", "device"):
        return f"its {name}"
    if phase is Phase.OTHER:
        return "its host time outside torch ops (Python, sleeps, I/O)"
    return f"its {phase.value}"


def _verdict(ranks: Sequence[RankBreakdown], straggler: Straggler | None, steps_by: str) -> str:
    counted = [len(r.steps) for r in ranks]
    if not counted or not any(counted):
        return f"no {steps_by.rstrip('s')} was recorded: nothing to compare"
    if straggler is not None:
        return str(straggler)
    if len(ranks) < 2:
        return "one rank profiled: nothing to compare it with"
    return f"no rank stands out: the ranks are busy for about as long per {steps_by.rstrip('s')}"


def _median(values: Iterable[float]) -> float:
    """The median, 0 for none: a step's typical time, which one warm-up step (a cell's first,
    with its imports, model and iterator to make) does not move."""
    xs = list(values)
    return float(statistics.median(xs)) if xs else 0.0


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.1f} ms"
