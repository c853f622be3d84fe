"""Overflow tracing per rank: `watch(model)` and `detect(tensor, ctx)`.

This module imports torch; `import distnb` does not import it. On a rank (or in any process)::

    import distnb.overflow

    w = distnb.overflow.watch(model, stop_on_nonfinite=True)   # stats="fast" by default
    ...train...
    w.report()       # a RankOverflowReport; summarize() lines several ranks' reports up
    w.detach()

See `distnb.rank.overflow` for how the statistics are computed and read back, and
`distnb.records.overflow` for the records and the cross-rank summary.
"""

from __future__ import annotations

from distnb.errors import NonFiniteError, OverflowStop
from distnb.rank.overflow import Watch, detect, watch
from distnb.records.overflow import (
    CrossRankSummary,
    Frame,
    RankOverflowReport,
    Stats,
    WatchOptions,
    summarize,
)

__all__ = [
    "CrossRankSummary",
    "Frame",
    "NonFiniteError",
    "OverflowStop",
    "RankOverflowReport",
    "Stats",
    "Watch",
    "WatchOptions",
    "detect",
    "summarize",
    "watch",
]
