"""Waits that a busy machine stretches.

Some of distnb's verdicts rest on a wait: the parent of a dead process ends within half a
second, an interrupted rank stops within seconds. On a machine with more runnable work than
cores those waits run long (a controller told to stop took over a second to end after its heart
monitor, and 10 ranks took over 3 s to stop after an interrupt, at load averages of 10-17 on 2
cores), and a verdict taken at the quiet machine's bound names the wrong cause. `stretched`
scales such a bound by the load average per core, up to a ceiling.
"""

from __future__ import annotations

import os

__all__ = ["stretched"]


def stretched(quiet_s: float, most_s: float) -> float:
    """`quiet_s`, times the load average per core when that is above 1, at most `most_s`."""
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    return min(most_s, quiet_s * max(1.0, load))
