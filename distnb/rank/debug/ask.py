"""A rank's stdin: a line typed in the notebook, asked for through the control plane.

Engines have no frontend of their own, but the kernel has one. `Asker.ask` posts an
`InputRequest` (rank, prompt, where the rank is) to the store, leaves a `STOPPED` beacon so that
everything that judges time leaves the wait out, and waits for the kernel's answer in short
slices, so that Ctrl-C (the kernel's interrupt) still lands. The rank's output is flushed first,
and the request says how much there was: the kernel shows it all before the prompt.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from distnb.contract import keys, posts
from distnb.rank.debug.stops import begin_run as begin_stops
from distnb.rank.debug.stops import stopped
from distnb.records.beacon import Beacon, BeaconState
from distnb.records.collective import CallSite
from distnb.records.debug import QUIT, SKIP, AskKind, InputRequest

__all__ = ["Asker", "NoInput", "Quit"]

# How long one wait for the answer blocks before Python gets to handle a signal.
POLL_S = 0.02  # how soon an answer is read


class NoInput(EOFError):
    """The kernel cannot ask the user (no frontend stdin): the rank carries on without an answer.

    An `EOFError`, as `input()` raises when stdin has nothing more to give."""


class Quit(KeyboardInterrupt):
    """The user interrupted the kernel while this rank's prompt was open."""


class Asker:
    """Asks the kernel's user for lines on behalf of one rank.

    `run_id` and `stdin` are the current run's (set at each cell's start): whether the kernel's
    frontend can answer at all. `base` holds the output streams' counts at the run's start.
    """

    def __init__(self, store: Any, rank: int) -> None:
        self.store = store
        self.rank = rank
        count = keys.ask_count(rank)  # the kernel writes 0 before the ranks start
        self._asked = int(store.get(count)) if store.check([count]) else 0
        self.run_id = 0
        self.stdin = True
        self._base = (0, 0)

    def begin_run(self, run_id: int, stdin: bool) -> None:
        self.run_id, self.stdin = run_id, stdin
        begin_stops(self.rank, run_id)
        self._base = (_written(sys.stdout), _written(sys.stderr))

    def ask(
        self,
        prompt: str,
        site: CallSite | None,
        kind: AskKind = AskKind.INPUT,
        mesh: dict[str, int] | None = None,
    ) -> str:
        """The line the user typed for `prompt` (without its newline); `mesh` is the rank's
        place in its code's DeviceMesh, if any.

        Raises `NoInput` when no frontend can answer and `Quit` when the user interrupted the
        prompt."""
        if not self.stdin:
            raise NoInput(self.no_input(site, kind))
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        self._asked += 1
        n = keys.ask_number(self.rank, self._asked)
        request = InputRequest(
            n=n,
            rank=self.rank,
            run_id=self.run_id,
            prompt=prompt,
            where=str(site) if site is not None else "",
            kind=kind,
            stdout=_written(sys.stdout) - self._base[0],
            stderr=_written(sys.stderr) - self._base[1],
            mesh=mesh or {},
        )
        self._beacon(BeaconState.STOPPED, site)
        # kept, so that the kernel can ask for them again if a stranger overwrote them
        count = str(self._asked)
        for key, value in ((keys.ask(n), request.to_json()), (keys.ask_count(self.rank), count)):
            posts.post(self.store, key, value)
        try:
            with stopped():
                answer = self._wait(keys.answer(n))
        finally:
            posts.drop(keys.ask(n))
            self._beacon(BeaconState.RUNNING, site)
        if answer == QUIT:
            raise Quit
        if answer == SKIP:
            raise NoInput(self.no_input(site, kind))
        return answer

    def no_input(self, site: CallSite | None, kind: AskKind) -> str:
        what = {AskKind.DEBUGGER: "breakpoint", AskKind.INPUT: "input()"}.get(kind, "getpass()")
        where = f" at {site}" if site is not None else ""
        return (
            f"rank {self.rank}: {what}{where} skipped: this frontend takes no input "
            "(nbconvert, papermill and allow_stdin=False cannot answer a prompt)"
        )

    def _wait(self, key: str) -> str:
        # Polled, not waited on: each store wait that times out makes torch write a warning
        # line ("waitForInput: poll for socket ... returned 0, likely a timeout") to the
        # process's stderr; Ctrl-C is handled between polls.
        while not self.store.check([key]):
            time.sleep(POLL_S)
        value: bytes = self.store.get(key)
        self.store.delete_key(key)
        return value.decode()

    def _beacon(self, state: BeaconState, site: CallSite | None) -> None:
        beacon = Beacon(self.rank, state, self.run_id, site=site)
        posts.post(self.store, keys.beacon(self.rank), beacon.to_json())


def _written(stream: Any) -> int:
    """Characters written to a stream of distnb's engine (0 for any other stream)."""
    return int(getattr(stream, "written", 0))
