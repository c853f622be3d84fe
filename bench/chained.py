"""Runs of one script on a warm session, each timed under the label of the run before it: what
a run does once it has replied (a switch on the ranks) is what the next run meets. The loop
bench_run_idle.py and bench_run_ahead.py share."""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

__all__ = ["Run", "chained_runs"]


class Run(NamedTuple):
    label: str  # what the run did at its end (the switch was on unless it is `labels[1]`)
    timed_under: str | None  # the label of the run before it; None for the two warm-up runs
    wall_s: float
    read: str  # rank 0's output of `read`, once the rank has been idle `pause` seconds


def chained_runs(
    session: Any,
    script: str,
    labels: Sequence[str],
    rounds: int,
    pause: float,
    switch: str,
    read: str,
) -> Iterator[Run]:
    """`rounds` rounds of one run per label, in an order that rotates from round to round, after
    two runs: the first imports what every run keeps, the second is timed under none. Before
    each run the ranks get `switch.format(on=...)`, off for `labels[1]`; each run and each
    `read` starts after `pause` seconds (a user reading the output)."""
    n = len(labels)
    order = [labels[(r + i) % n] for r in range(rounds) for i in range(n)]
    for k, label in enumerate([labels[0], *order, labels[0]]):
        session.run(switch.format(on=label != labels[1]))
        time.sleep(pause)
        quiet = io.StringIO()  # the ranks' output, shown as in a notebook
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            started = time.perf_counter()
            session.run_script(script)
            wall = time.perf_counter() - started
            time.sleep(pause)  # what the rank does once idle is over
            said = session.run(read, ranks=[0]).stdout(0)
        yield Run(label, order[k - 2] if k >= 2 else None, wall, said)
