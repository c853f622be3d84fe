"""Records of the overflow tracer, and the pure cross-rank summary over them.

A rank watches a model (`distnb.overflow.watch`); what comes back to the kernel is one
`RankOverflowReport` per rank, and `summarize(reports)` says which rank went non-finite first.

Terms:

- **step**: one training step as the tracer counts it: from one forward of the root module to the
  next (or to `Watch.step()` when steps are explicit). Numbered from 0 on every rank.
- **micro-step**: a forward of the root module within a step; always 0 unless steps are explicit
  (gradient accumulation runs several micro-steps per step).
- **frame**: one tensor seen at one point: a module call's input, output or weight (phase
  `forward`), the gradient flowing into a module's output (`backward`), or a parameter's `.grad`
  after accumulation (`grad`). `order` numbers the frames of a step in the order they were seen;
  ranks that run the same code see the same frames in the same order, so (step, micro, order)
  lines ranks up.
- **compute dtype**: the dtype the value has to fit in: under autocast, the dtype the module
  computed in; else the tensor's own dtype. **Headroom** is `log2(finfo(compute).max / abs max)`,
  the number of doublings left before overflow; **under** counts the non-zero values below
  `finfo(compute).tiny` (they lose precision or flush to zero).

Counts are `None` where the tracer did not measure them (its `fast` statistics, or the first step a
tensor showed zeros or non-finite values under `auto`); `min_nonzero` likewise.

`WatchOptions` is how a watch was asked for; `validated()` checks it once, in the kernel for
`%dist_overflow` and `Session.overflow`, on the rank for `distnb.overflow.watch`.

Records hold no tensors and import no torch; `to_dict` output is strict JSON (non-finite floats
are written as the strings "nan", "inf", "-inf").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from distnb.ranklist import format_ranks
from distnb.records.codec import Record

__all__ = [
    "CrossRankSummary",
    "Frame",
    "Phase",
    "RankOverflowReport",
    "Stats",
    "StepOn",
    "WatchOptions",
    "summarize",
]


class Phase(str, Enum):
    """Where in a step a frame was seen."""

    FORWARD = "forward"
    BACKWARD = "backward"
    GRAD = "grad"


class Stats(str, Enum):
    """How much the tracer measures per tensor (`distnb.rank.overflow` says what each costs).

    - `fast` (default): the largest `|x|` (so headroom, and whether NaN/Inf is there) in one
      read-only pass; counts only where that proves them.
    - `auto`: also every count the smallest `|x|` proves, and the missing ones from the next step
      on where it does not (about twice `fast`'s cost).
    - `full`: every count, every time.
    """

    FAST = "fast"
    AUTO = "auto"
    FULL = "full"

    def __str__(self) -> str:
        return str(self.value)


class StepOn(str, Enum):
    """What ends a step: the root module's next forward, or only `Watch.step()`."""

    FORWARD = "forward"
    EXPLICIT = "explicit"

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True, slots=True)
class WatchOptions(Record):
    """How to watch a model: `distnb.overflow.watch`'s keyword arguments, as one record.

    - `frames`: how many frames (tensors seen) to keep before the first non-finite one.
    - `trace_batches`: steps whose every frame is kept (`report().traced`).
    - `abort_after`: stop (raise `OverflowStop`, hooks removed) once this step has run.
    - `phases`: any of `forward`, `backward`, `grad`.
    - `rank`: None: the process group's rank, else 0.
    - `headroom_warn_bits`: warn (`DistnbWarning`, once per module and phase) when an fp16/bf16
      value is within this many doublings of its dtype's max.
    - `stats`: `fast`, `auto` or `full` (see `Stats`).
    - `step_on`: `forward` (each root forward starts a step) or `explicit` (`Watch.step()` ends
      steps; root forwards in between are micro-steps).
    - `stop_on_nonfinite`: raise `NonFiniteError` at the first read-back that finds NaN/Inf.

    Example::

        WatchOptions(frames=5, stats="auto").validated().stats   # Stats.AUTO
    """

    frames: int = 21
    trace_batches: tuple[int, ...] = ()
    abort_after: int | None = None
    phases: tuple[Phase, ...] = (Phase.FORWARD, Phase.BACKWARD, Phase.GRAD)
    rank: int | None = None
    headroom_warn_bits: float = 4.0
    stats: Stats = Stats.FAST
    step_on: StepOn = StepOn.FORWARD
    stop_on_nonfinite: bool = False

    @classmethod
    def of(cls, **options: Any) -> WatchOptions:
        """Validated options from keyword arguments; a bad or unknown one is a `ValueError`
        naming it (callers raise it as `ConfigError`)."""
        unknown = sorted(set(options) - set(cls.__dataclass_fields__))
        if unknown:
            known = ", ".join(cls.__dataclass_fields__)
            raise ValueError(f"unknown overflow option(s) {', '.join(unknown)}; known: {known}")
        return cls(**options).validated()

    def validated(self) -> WatchOptions:
        """These options with their values checked and normalised (enums, sorted steps)."""
        asked = _items(self.phases, "phases")
        known = {p.value for p in Phase}
        if not asked or any(p not in known for p in asked):
            raise ValueError(f"phases must be some of {_values(Phase)}; got {asked!r}")
        _whole(self.frames, "frames", 1)
        steps = {_whole(s, "trace_batches", 0) for s in _items(self.trace_batches, "trace_batches")}
        for name in ("abort_after", "rank"):
            if getattr(self, name) is not None:
                _whole(getattr(self, name), name, 0)
        if not isinstance(self.stop_on_nonfinite, bool):
            raise ValueError(
                f"stop_on_nonfinite must be True or False; got {self.stop_on_nonfinite!r}"
            )
        bits = self.headroom_warn_bits
        if isinstance(bits, bool) or not isinstance(bits, (int, float)) or not bits >= 0:
            raise ValueError(f"headroom_warn_bits must be a number >= 0; got {bits!r}")
        return replace(
            self,
            phases=tuple(p for p in Phase if p in asked),
            trace_batches=tuple(sorted(steps)),
            headroom_warn_bits=float(bits),
            stats=_member(Stats, self.stats, "stats"),
            step_on=_member(StepOn, self.step_on, "step_on"),
        )


def _values(enum: type[Enum]) -> str:
    return ", ".join(repr(m.value) for m in enum)


def _member(enum: type[Any], value: object, name: str) -> Any:
    try:
        return enum(value)
    except ValueError:
        raise ValueError(f"{name} must be one of {_values(enum)}; got {value!r}") from None


def _items(value: object, name: str) -> tuple[object, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValueError(f"{name} must be a list; got {value!r}")
    return tuple(value)


def _whole(value: object, name: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be a whole number >= {least}; got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Frame(Record):
    """One tensor at one point of a step, with statistics read back from the device.

    `abs_min`/`abs_max` are the smallest and largest `|x|` (NaN when the tensor holds a NaN;
    `abs_min` counts zeros, and is None under `fast` statistics when the values change sign).
    `readback_ns` is `time.time_ns()` when the step was read back.
    """

    step: int
    micro: int
    order: int
    module: str
    cls: str
    phase: Phase
    name: str
    dtype: str
    compute_dtype: str
    numel: int
    abs_min: float | None
    abs_max: float
    min_nonzero: float | None = None
    nan: int | None = None
    inf: int | None = None
    zeros: int | None = None
    under: int | None = None
    headroom_bits: float | None = None
    readback_ns: int = 0

    @property
    def nonfinite(self) -> bool:
        return not math.isfinite(self.abs_max)

    @property
    def where(self) -> str:
        """`layers.2 (Linear) forward output`."""
        return f"{self.module or '<root>'} ({self.cls}) {self.phase.value} {self.name}"

    @property
    def point(self) -> tuple[int, int, int]:
        """(step, micro, order): the position that lines ranks up."""
        return (self.step, self.micro, self.order)

    @property
    def underflow_share(self) -> float | None:
        """Share of the non-zero values that lie under the compute dtype's `tiny`."""
        if self.under is None or self.zeros is None or self.nan is None:
            return None
        nonzero = self.numel - self.zeros - self.nan
        return self.under / nonzero if nonzero else 0.0

    def describe(self) -> str:
        """What is wrong with the values, in words: `3 NaN, 1 Inf of 4096 values`."""
        if not self.nonfinite:
            return f"|x| max {self.abs_max:.3g}"
        if self.nan is None or self.inf is None:
            kind = "NaN" if math.isnan(self.abs_max) else "Inf"
            return f"{kind} among {self.numel} values (counts not measured)"
        return f"{self.nan} NaN, {self.inf} Inf of {self.numel} values"


@dataclass(frozen=True, slots=True)
class RankOverflowReport(Record):
    """What one rank's tracer saw.

    `first`: the first non-finite frame (None while every value was finite). `ring`: the last
    frames up to and including `first` (while clean: the last frames of the latest step).
    `traced`: every frame of the steps listed in `trace_batches`. `headroom`: the frames that
    raised a low-headroom warning, the first time each (module, phase) did. `readbacks`: how many
    host syncs the tracer made (one per step and device). `stopped`: why the watch stopped the
    run (`"nonfinite"`, `"abort_after"`), else empty.
    """

    rank: int
    steps: int
    readbacks: int
    first: Frame | None = None
    ring: tuple[Frame, ...] = ()
    traced: tuple[Frame, ...] = ()
    headroom: tuple[Frame, ...] = ()
    stopped: str = ""
    stats: Stats = Stats.FAST

    def __post_init__(self) -> None:
        if not isinstance(self.stats, Stats):  # "auto" as a plain string reads as Stats.AUTO
            object.__setattr__(self, "stats", Stats(self.stats))


@dataclass(frozen=True, slots=True)
class CrossRankSummary(Record):
    """Which rank went non-finite first, and who got it later.

    - `first_rank`/`first`: the earliest first non-finite frame over all ranks, by (step,
      micro-step, order), then by the wall-clock time of that step's readback, then by rank.
    - `origin`: every rank whose first non-finite frame is at that same (step, micro, order):
      they went bad at the same point on their own.
    - `received`: ranks whose first non-finite value comes at a later point. In data-parallel
      training that is what a collective does: an all-reduce of gradients (or DDP) carries the
      origin's Inf into every rank's `.grad`, and the optimizer into every rank's weights, so the
      other ranks first show it at the next backward's `.grad` or the next step's weights.
    - `clean`: ranks that stayed finite.

    Order only lines ranks up when they run the same modules in the same sequence (the usual
    data-parallel case); with rank-dependent control flow, compare `firsts` by hand.
    """

    ranks: tuple[int, ...]
    firsts: tuple[Frame | None, ...]
    first_rank: int | None
    origin: tuple[int, ...]
    received: tuple[int, ...]
    clean: tuple[int, ...]

    @property
    def first(self) -> Frame | None:
        if self.first_rank is None:
            return None
        return self.firsts[self.ranks.index(self.first_rank)]

    def lines(self) -> list[str]:
        first = self.first
        if first is None:
            return [f"No non-finite values on {format_ranks(self.ranks)}."]
        who = format_ranks(self.origin)
        out = [
            f"{who} went non-finite first: step {first.step}"
            + (f" micro-step {first.micro}" if first.micro else "")
            + f", {first.where}: {first.describe()}."
        ]
        for rank in self.received:
            f = self.firsts[self.ranks.index(rank)]
            assert f is not None
            out.append(
                f"rank {rank} received it later (likely through a collective): step {f.step}, "
                f"{f.where}."
            )
        if self.clean:
            out.append(f"Still finite: {format_ranks(self.clean)}.")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def summarize(reports: Sequence[RankOverflowReport]) -> CrossRankSummary:
    """Line the ranks' first non-finite frames up; see `CrossRankSummary` for the rules.

    Example::

        summary = summarize([report_rank0, report_rank1])
        summary.first_rank, summary.received   # (1, (0,))
    """
    ordered = sorted(reports, key=lambda r: r.rank)
    ranks = tuple(r.rank for r in ordered)
    firsts = tuple(r.first for r in ordered)
    bad = [(f.point, f.readback_ns, r) for r, f in zip(ranks, firsts, strict=True) if f]
    if not bad:
        return CrossRankSummary(ranks, firsts, None, (), (), ranks)
    point, _, first_rank = min(bad)
    origin = tuple(r for p, _, r in sorted(bad, key=lambda b: b[2]) if p == point)
    received = tuple(r for p, _, r in sorted(bad, key=lambda b: b[2]) if p != point)
    clean = tuple(r for r, f in zip(ranks, firsts, strict=True) if f is None)
    return CrossRankSummary(ranks, firsts, first_rank, origin, received, clean)
