"""Which stopped rank JupyterLab's debugger panel shows, and when that changes.

JupyterLab's panel shows one stopped thread at a time: every `stopped` event replaces the
thread it shows, and every `continued` event clears the panel, whichever thread it names. With
ranks as threads that would make the panel jump to whichever rank stopped last, and empty it
when any rank goes on. `Panel` decides what the frontend is told:

- the first rank to stop is shown; other ranks that stop meanwhile are held (their `stopped`
  events are not forwarded: they are listed in `debugInfo` and as frames below the shown
  rank's stack, `[rank 0] <module> (select to show)`);
- the shown rank keeps the panel while it steps (`next`, `stepIn`, `stepOut`): its own
  `continued` and `stopped` events go through; if it has not stopped again within
  `STEP_GRACE_S` (a step over a collective that waits for a held rank), the next stopped rank is
  shown, as the text debugger gives the prompt to the next rank;
- when the shown rank continues, goes away or dies, the lowest held rank is shown;
- selecting a held rank's frame in the call stack shows that rank (`switch`): the frontend then
  still names the previous thread in its requests, which go to the rank it shows (`route`);
- once the frontend switched the debugger off, it is told nothing (`quiet`) until the next
  cell connects to the ranks again (`listen`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from distnb.session.debugger.ids import decode, encode

__all__ = ["STEP_GRACE_S", "Panel"]

Message = dict[str, Any]

STEP_GRACE_S = 0.5


class Panel:
    """What the frontend shows of the stopped ranks; `stopped()` is the relay's map of stopped
    ranks (rank -> its stopped event's body, with the rank's own ids), `emit` sends an event."""

    def __init__(
        self, stopped: Callable[[], dict[int, Message]], emit: Callable[[str, Message], None]
    ) -> None:
        self._stopped = stopped
        self._emit = emit
        self.shown: int | None = None  # the thread (a shifted id) the frontend shows
        self.left: int | None = None  # the thread it names still, after a switch
        self._quiet = False
        self._lock = threading.RLock()

    def rank(self) -> int | None:
        return decode(self.shown)[0] if self.shown is not None else None

    def stopped(self, rank: int, body: Message) -> None:
        """`rank` stopped: shown if nothing else is (or it is the rank shown, stepping)."""
        with self._lock:
            if self.shown is None or self.rank() == rank:
                self._show(rank, body)

    def continued(self, rank: int, by: str) -> None:
        """`rank` goes on, by the frontend's `by` request ("" for another reason)."""
        with self._lock:
            if self.rank() != rank or self._quiet:
                return  # a held rank: the frontend never saw it stop
            self._emit("continued", {"threadId": self.shown})
            if by in ("next", "stepIn", "stepOut"):
                timer = threading.Timer(STEP_GRACE_S, self._after_step, (rank,))
                timer.daemon = True
                timer.start()
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
            if self.left is None:
                self.left = self.shown
            self.shown = encode(rank, body["threadId"])

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

    def _show(self, rank: int, body: Message) -> None:
        if self._quiet:
            return
        self.shown = encode(rank, body["threadId"])
        self.left = None
        shown = {**body, "threadId": self.shown, "allThreadsStopped": False}
        held = sorted(set(self._stopped()) - {rank})
        also = f" (also stopped: {', '.join(map(str, held))})" if held else ""
        shown["description"] = f"rank {rank}: {body.get('description') or body.get('reason')}{also}"
        self._emit("stopped", shown)

    def _after_step(self, rank: int) -> None:
        with self._lock:
            if self.rank() == rank and rank not in self._stopped():
                self.shown = self.left = None
                self.show_next()
