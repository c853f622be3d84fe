"""Which stopped rank JupyterLab's debugger panel shows, and when that changes.

JupyterLab's panel shows one stopped thread at a time: every `stopped` event replaces the
thread it shows, and every `continued` event clears the panel, whichever thread it names. With
ranks as threads that would make the panel jump to whichever rank stopped last, and empty it
when any rank goes on. `Panel` decides what the frontend is told:

- the first rank to stop is shown; other ranks that stop meanwhile are held (their `stopped`
  events are not forwarded: they are listed in `debugInfo` and as frames below the shown
  rank's stack, `[rank 0] <module> (select to show)`);
- the shown rank keeps the panel while it steps (`next`, `stepIn`, `stepOut`), however long the
  step takes on a busy machine: its own `continued` and `stopped` events go through. Another
  rank is shown only when the stepping rank says it waits for a held rank (`waits`: its beacon,
  a step over a collective), or when it has not stopped again for `STEP_QUIET_S` times the
  load per core (a step out of the cell's code: the rank finished it), as the text debugger
  gives the prompt to the next rank;
- a rank held after the frontend fetched the shown rank's stack without it (a rank slower to
  stop on a busy machine) gets the shown rank's `stopped` event sent again, marked
  `preserveFocusHint`: the frontend fetches the stack again, with that rank listed;
- when the shown rank continues, goes away or dies, the lowest held rank is shown;
- selecting a held rank's frame in the call stack shows that rank (`switch`): its stopped event
  is sent, so the frontend lists that rank's stack first and the rank shown before as held;
  a request still naming the thread shown before goes to the rank shown (`route`);
- once the frontend switched the debugger off, it is told nothing (`quiet`) until the next
  cell connects to the ranks again (`listen`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from distnb.session.debugger.ids import decode, encode
from distnb.session.load import stretched

__all__ = ["STEP_MOST_S", "STEP_QUIET_S", "Panel"]

Message = dict[str, Any]

# A step that has not stopped again after this long (times the load per core, up to
# `STEP_MOST_S`) left the code it stepped in. Clicked in JupyterLab on 2 ranks, steps took
# 0.3-2.2 s on 2 cores at a load of 10 (a fixed 0.5 s made the panel jump to another rank).
STEP_QUIET_S = 5.0
STEP_MOST_S = 30.0
STEP_POLL_S = 0.1


class Panel:
    """What the frontend shows of the stopped ranks; `stopped()` is the relay's map of stopped
    ranks (rank -> its stopped event's body, with the rank's own ids), `emit` sends an event."""

    def __init__(
        self,
        stopped: Callable[[], dict[int, Message]],
        emit: Callable[[str, Message], None],
        waits: Callable[[int], bool] = lambda rank: False,
    ) -> None:
        self._stopped = stopped
        self._emit = emit
        self._waits = waits  # whether a running rank says it waits for a held rank
        self.shown: int | None = None  # the thread (a shifted id) the frontend shows
        self.left: int | None = None  # the thread it names still, after a switch
        self._step: object | None = None  # the shown rank's step under way, until it stops
        self._listed: set[int] | None = None  # held ranks in the stack the frontend fetched
        self._quiet = False
        self._lock = threading.RLock()

    def rank(self) -> int | None:
        return decode(self.shown)[0] if self.shown is not None else None

    def stopped(self, rank: int, body: Message) -> None:
        """`rank` stopped: shown if nothing else is (or it is the rank shown, stepping)."""
        with self._lock:
            if self.shown is None or self.rank() == rank:
                self._show(rank, body)
            elif self._listed is not None and rank not in self._listed:
                shown = self.rank()
                found = self._stopped().get(shown) if shown is not None else None
                if shown is not None and found is not None:  # not while it steps
                    self._show(shown, found, again=True)

    def listing(self) -> set[int]:
        """The frontend fetches the shown rank's stack: the caller adds each held rank it
        lists to the set returned (a rank held later is not in it: `stopped`)."""
        with self._lock:
            self._listed = set()
            return self._listed

    def continued(self, rank: int, by: str) -> None:
        """`rank` goes on, by the frontend's `by` request ("" for another reason)."""
        with self._lock:
            if self.rank() != rank or self._quiet:
                return  # a held rank: the frontend never saw it stop
            self._emit("continued", {"threadId": self.shown})
            if by in ("next", "stepIn", "stepOut"):
                self._step = step = object()
                self._after_step(rank, step, time.monotonic())
                return
            self.shown = self.left = None
            self.show_next()

    def show_next(self) -> None:
        """Show the lowest stopped rank, if the frontend shows none."""
        with self._lock:
            if self.shown is not None:
                return
            still = sorted(self._stopped().items())
            if still:
                self._show(*still[0])

    def switch(self, rank: int) -> None:
        """The user selected a frame of `rank`: show it, if it is stopped and not shown."""
        with self._lock:
            body = self._stopped().get(rank)
            if body is None or self.rank() == rank:
                return
            left = self.left if self.left is not None else self.shown
            self._show(rank, body)
            self.left = left

    def route(self, thread: int) -> int:
        """The thread a frontend's request is for: the one it shows, where it names the one it
        showed before a switch."""
        with self._lock:
            if self.left is not None and thread == self.left and self.shown is not None:
                return self.shown
            return thread

    def threads(self) -> list[int]:
        """Every stopped rank's thread, the shown one first (JupyterLab takes the first)."""
        with self._lock:
            all_ = [encode(r, b.get("threadId", 0)) for r, b in sorted(self._stopped().items())]
            return sorted(all_, key=lambda t: t != self.shown)

    def quiet(self) -> None:
        """The frontend switched the debugger off: show nothing, tell it nothing."""
        with self._lock:
            self.shown = self.left = None
            self._quiet = True

    def listen(self) -> None:
        """The ranks are connected again (a cell of an attached frontend)."""
        with self._lock:
            self._quiet = False

    def _show(self, rank: int, body: Message, again: bool = False) -> None:
        if self._quiet:
            return
        self.shown = encode(rank, body["threadId"])
        self.left = self._step = self._listed = None
        shown = {**body, "threadId": self.shown, "allThreadsStopped": False}
        if again:
            shown["preserveFocusHint"] = True  # the same stop, its stack to fetch again
        held = sorted(set(self._stopped()) - {rank})
        also = f" (also stopped: {', '.join(map(str, held))})" if held else ""
        shown["description"] = f"rank {rank}: {body.get('description') or body.get('reason')}{also}"
        self._emit("stopped", shown)

    def _after_step(self, rank: int, step: object, since: float) -> None:
        """Show the next stopped rank once the stepping `rank` waits for a held one, or has
        not stopped again for long; else look again in `STEP_POLL_S` (until it stops: a rank
        that stopped and went on since is no longer stepping)."""
        with self._lock:
            if self._step is not step or self.rank() != rank or self._quiet:
                return
            within = time.monotonic() - since < stretched(STEP_QUIET_S, STEP_MOST_S)
            if within and not self._waits(rank):
                timer = threading.Timer(STEP_POLL_S, self._after_step, (rank, step, since))
                timer.daemon = True
                timer.start()
                return
            self.shown = self.left = None
            self.show_next()
