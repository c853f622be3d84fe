"""Post-mortem on the ranks: the run that opens a failed rank's debugger, and IPython's own
habits (`%debug`, `%pdb on`) routed to it.

A rank keeps the exception its last cell raised (`distnb.rank.debug.end_run`). The kernel opens
it with a cell of its own on that rank (`POST_MORTEM`), so that its prompts are served, its
output shown and Ctrl-C handled as for any cell.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from distnb.errors import ConfigError, RankError, SessionError
from distnb.records.cell import RankInfo
from distnb.session.runs.failures import debuggable
from distnb.session.runs.request import CellRequest

if TYPE_CHECKING:
    from distnb.session.surface import SessionSurface

__all__ = ["POST_MORTEM", "post_mortem_request", "route_debugger", "unroute_debugger"]

POST_MORTEM = "__import__('distnb.rank.debug', fromlist=['post_mortem']).post_mortem()"


def post_mortem_request(
    failed: RankError | None, rank: int | None, ranks: Sequence[RankInfo], cell: int
) -> CellRequest:
    """The run that opens `rank`'s debugger at the frame where `failed`, the last run's error,
    was raised (`rank` None: the first rank that failed, the cause before those it released)."""
    if failed is None:
        raise SessionError(
            "nothing to debug: the last %%allranks cell or %dist_run raised nothing (a rank keeps "
            "its traceback until its next cell)"
        )
    candidates = debuggable(failed.failures)
    if not candidates:
        raise SessionError("no rank of the last run has a traceback to debug: they died")
    if rank is None:
        rank = candidates[0]
    elif rank not in candidates:
        raise ConfigError(
            f"rank {rank} did not fail in the last run; ranks that did: "
            f"{', '.join(map(str, candidates))} (e.g. %dist_debug {candidates[0]})"
        )
    info = next(r for r in ranks if r.rank == rank)
    return CellRequest(cell, 0, POST_MORTEM, (info,), check=False, timeout=None, everyone=False)


def route_debugger(shell: Any, session: Callable[[], SessionSurface | None]) -> None:
    """Make `%debug` and `%pdb on` open the failed rank after a `RankError` (IPython's own
    debugger would open distnb's frames in the kernel); other errors keep IPython's.

    Both end in `shell.debugger(force)`, which this wraps; `session()` is the running session.
    """
    if getattr(shell.debugger, "_distnb", False):
        return
    original = shell.debugger

    def debugger(force: bool = False) -> None:
        error = getattr(sys, "last_value", None)
        running = session()
        if not (force or shell.call_pdb) or not isinstance(error, RankError):
            original(force)
        elif running is not None and running.debugs(error):
            running.debug()
        else:
            print(
                "distnb: the ranks no longer hold that error's traceback (they ran another "
                "cell, or the cluster stopped); %dist_debug opens the last failed run's"
            )

    debugger._distnb = True  # type: ignore[attr-defined]
    debugger.original = original  # type: ignore[attr-defined]
    shell.debugger = debugger


def unroute_debugger(shell: Any) -> None:
    original = getattr(shell.debugger, "original", None)
    if original is not None:
        shell.debugger = original
