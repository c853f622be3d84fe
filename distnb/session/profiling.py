"""Profiling what ranks run: `torch.profiler` on every rank, one view of all of them. Functions of
a `Session`, bound to it as methods (`Session.profile`, `Session.profile_report`).

>>> s.profile(steps=5)             # %dist_profile --steps 5: the next cells, until 5 steps
>>> s.run(train_cell)
>>> s.profile_report()             # %dist_profile --report: steps by phase, the straggler
>>> s.run(cell, profile=True)      # %%allranks --profile: this cell; the view on result.views

The ranks hold what they record (`distnb.rank.profiling`); the kernel keeps nothing, so a session
that profiles nothing pays nothing.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from distnb.errors import ConfigError, DistnbError

if TYPE_CHECKING:
    from distnb.ranklist import RankArg
    from distnb.session.surface import SessionSurface
    from distnb.views.profiling import ProfileView

__all__ = ["profile", "profile_discard", "profile_report"]


def profile(
    session: SessionSurface, steps: int | None = None, ranks: RankArg | None = None
) -> None:
    """Profile what the next cells run on every rank (or the listed ones), until `steps`
    optimizer steps have ended on a rank (that rank's profiler stops after the cell), or until
    `profile_report()`. Arming again starts over."""
    from distnb.rank import profiling

    if steps is not None and (isinstance(steps, bool) or steps < 1):
        raise ConfigError(f"steps is how many optimizer steps to profile, 1 or more; got {steps}")
    session.require_running(notice=True)
    session.call(profiling.arm, steps, ranks=ranks)


def profile_report(session: SessionSurface) -> ProfileView:
    """Stop profiling; each rank's steps split by phase, the straggler and its cause, as one
    view (`export_chrome_trace(path)` writes every rank's profile as one Perfetto trace)."""
    from distnb.rank import profiling, runtime
    from distnb.session.inspection import _clock_offsets
    from distnb.views.profiling import ProfileView

    session.require_running(notice=True)
    profiles = [p for p in session.call(profiling.collect) if p is not None]
    if not profiles:
        raise ConfigError(
            "nothing is being profiled: %dist_profile [--steps N] profiles the next cells, "
            "%%allranks --profile one cell"
        )
    runs = [r for p in profiles for r in p.runs if r]
    if not runs:
        raise ConfigError(
            "the profiler is armed but no cell ran since: run the cells to profile, then "
            "%dist_profile --report"
        )
    events = [e for per_rank in session.call(runtime.events, min(runs)) for e in per_rank]
    clocks = _clock_offsets(session)
    offsets = dict(clocks.offsets_ns) if clocks is not None else {}
    return ProfileView(profiles, events, offsets, clocks.precision_ns if clocks else 0)


def profile_discard(session: SessionSurface) -> None:
    """Stop profiling and drop what was recorded (a profiled cell that failed)."""
    from distnb.rank import profiling

    with contextlib.suppress(DistnbError):
        session.call(profiling.collect)
