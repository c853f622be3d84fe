"""What a session shows about its ranks besides cell output: shape tables, overflow traces,
timelines. Functions of a `Session`, bound to it as methods (`Session.shapes`, ...), kept here so
that the session module holds its lifecycle and cells only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from distnb.errors import ConfigError

if TYPE_CHECKING:
    from distnb.ranklist import RankArg
    from distnb.session.surface import SessionSurface
    from distnb.views.overflow import OverflowView
    from distnb.views.shapes import ShapeTableView
    from distnb.views.timeline import TimelineView
    from distnb.views.timeline.model import ClockOffsets

__all__ = ["overflow", "overflow_detach", "overflow_report", "shapes", "timeline"]


def shapes(
    session: SessionSurface,
    names: Sequence[str] | None = None,
    all: bool = False,
    ranks: RankArg | None = None,
) -> ShapeTableView:
    """A table of each rank's tensors and modules (metadata only), differences first.

    >>> s.shapes(["batch"])         # %dist_shapes batch
    """
    from distnb.rank import runtime
    from distnb.views.shapes import ShapeTableView

    scans = session.call(runtime.scan, list(names) if names else None, all, ranks=ranks)
    return ShapeTableView.from_scans(scans)


def overflow(
    session: SessionSurface, name: str, ranks: RankArg | None = None, **options: Any
) -> None:
    """Trace overflow on every rank's module `name`: `distnb.overflow.watch`'s options.

    The options are checked here, before any rank is asked (`ConfigError`).

    >>> s.overflow("model", stats="auto", stop_on_nonfinite=True)
    """
    from distnb.rank import runtime
    from distnb.records.overflow import WatchOptions

    try:
        record = WatchOptions.of(**options)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    session.call(runtime.overflow_watch, name, record.to_dict(), ranks=ranks)


def overflow_detach(session: SessionSurface, name: str) -> None:
    """Remove every hook of the tracer on `name`: ranks run at full speed again."""
    from distnb.rank import runtime

    if not any(session.call(runtime.overflow_detach, name)):
        raise ConfigError(f"no overflow trace named {name!r}; start one with %dist_overflow")


def overflow_report(
    session: SessionSurface, ranks: RankArg | None = None
) -> dict[str, OverflowView]:
    """Each traced module's frames per rank, and which rank went non-finite first."""
    from distnb.rank import runtime
    from distnb.views.overflow import OverflowView

    per_rank = session.call(runtime.overflow_reports, ranks=ranks)
    names = sorted({name for reports in per_rank for name in reports})
    return {n: OverflowView([r[n] for r in per_rank if n in r]) for n in names}


def timeline(session: SessionSurface, cells: int | None = None) -> TimelineView:
    """Every recorded collective of the last `cells` runs (all kept, by default), per rank.

    >>> s.timeline(cells=1).export_chrome_trace("trace.json")
    """
    from distnb.rank import runtime
    from distnb.rank.debug.stops import stops
    from distnb.views.timeline import TimelineView

    since = None if cells is None else max(1, session.runs - cells + 1)
    events = [e for per_rank in session.call(runtime.events, since) for e in per_rank]
    stopped = [s for per_rank in session.call(stops, since) for s in per_rank]
    hosts = {r.rank: r.host for r in session.ranks}
    return TimelineView(events, _clock_offsets(session), hosts, stopped)


def _clock_offsets(session: SessionSurface) -> ClockOffsets | None:
    """Per-rank offsets onto the kernel's clock: none on one host (one monotonic clock)."""
    from distnb.session.clocks import estimate_offsets

    if len({r.host for r in session.ranks}) <= 1:
        return None
    return estimate_offsets(session.call, [r.rank for r in session.ranks])
