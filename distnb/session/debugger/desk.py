"""The kernel's end of stopped ranks: their prompts asked in the notebook, one at a time.

A rank stopped in its debugger (or calling `input()`) posts an `InputRequest` to the control
plane (`distnb.rank.debug`). While a cell runs, its wait loop hands those requests to `Desk.serve`,
which shows what the rank printed so far, asks the user through the kernel's own `input()` (the
frontend's input box, the terminal's prompt), and posts the answer back. The cell's clock stops
meanwhile: time spent with the user does not count towards its timeout.

Several stopped ranks are asked in rank order, one prompt at a time; the rank at hand keeps the
prompt while it steps (`n`, `s`), and gives it up when it continues or quits. Two commands are
the desk's own, at any debugger prompt: `ranks` lists where every rank is, `rank N` switches to
another stopped rank. An interrupt at a prompt quits that rank's debugger; a frontend that takes
no input (nbconvert, papermill, `allow_stdin=False`) gets every prompt answered with `SKIP`.
"""

from __future__ import annotations

import builtins
import getpass
import re
import sys
import time
from typing import Protocol

from distnb.records.cell import RankState
from distnb.records.debug import QUIT, SKIP, AskKind, InputRequest
from distnb.session.control import ControlPlane

__all__ = ["Desk", "RunView", "frontend_stdin"]

# How long the rank at hand gets to stop again after a stepping command before another stopped
# rank gets the prompt (a step over a long call may take longer: the other rank goes first).
STEP_GRACE_S = 0.5
# How long a rank's output may trail its prompt (iopub and the store are separate channels).
OUTPUT_WAIT_S = 2.0
# Debugger commands after which the rank runs on rather than stopping again at once.
_RUNS_ON = re.compile(r"\s*(c|cont|continue|q|quit|exit|EOF)\s*$")
_SWITCH = re.compile(r"\s*rank\s+(\d+)\s*$")


class RunView(Protocol):
    """What the desk needs of the running cell (`distnb.session.runs.run.CellRun`)."""

    def states(self) -> dict[int, RankState]: ...
    def written(self, rank: int) -> tuple[int, int]: ...
    def show_output(self) -> None: ...
    def beacon_words(self) -> dict[int, str]: ...


def frontend_stdin() -> bool:
    """Whether the kernel can ask its user for a line: the frontend's input box in Jupyter
    (unless it said `allow_stdin=False`, as nbconvert and papermill do), the terminal's prompt
    in IPython, a terminal for a plain Python script."""
    from IPython import get_ipython

    shell = get_ipython()
    kernel = getattr(shell, "kernel", None)
    if kernel is not None:
        return bool(getattr(kernel, "_allow_stdin", False))
    if shell is not None:
        return True
    return sys.stdin is not None and sys.stdin.isatty()


class Desk:
    """Serves the prompts of one run's ranks (see the module's docstring)."""

    def __init__(self, control: ControlPlane, run_id: int):
        self.control = control
        self.run_id = run_id
        self.pending: dict[int, InputRequest] = {}
        self.current: int | None = None  # the rank whose prompt the user answers
        self._runs_on = True  # the last answer let the current rank run on
        self._no_stdin = False

    def serve(self, run: RunView) -> float:
        """Ask the user for every open prompt; return the seconds spent (the clock's pause)."""
        self._collect()
        if not self.pending:
            return 0.0
        start = time.monotonic()
        while self.pending:
            rank = self._next_rank()
            request = self.pending.pop(rank)
            self._show_up_to(run, request)
            answer = self._answer(run, request)
            if answer is None:  # the user switched ranks; this prompt stays open
                self.pending[rank] = request
                continue
            self.control.answer(request.n, answer)
            self._runs_on = answer in (QUIT, SKIP) or bool(_RUNS_ON.match(answer))
            self.current = rank
            self._collect()
        return time.monotonic() - start

    # --- which prompt next -------------------------------------------------------------------

    def _collect(self) -> None:
        for request in self.control.asks():
            if request.run_id == self.run_id:
                self.pending[request.rank] = request
            else:  # left over from a run that ended while it asked: that rank has moved on
                self.control.answer(request.n, QUIT)

    def _next_rank(self) -> int:
        """The rank at hand while it steps; else the lowest stopped rank (one is pending)."""
        current = self.current
        if current is not None and current not in self.pending and not self._runs_on:
            deadline = time.monotonic() + STEP_GRACE_S
            while current not in self.pending and time.monotonic() < deadline:
                time.sleep(0.005)
                self._collect()
        return current if current is not None and current in self.pending else min(self.pending)

    # --- asking ------------------------------------------------------------------------------

    def _show_up_to(self, run: RunView, request: InputRequest) -> None:
        """Wait until the kernel has the rank's output written before it asked, then show it."""
        deadline = time.monotonic() + OUTPUT_WAIT_S
        while time.monotonic() < deadline:
            out, err = run.written(request.rank)
            if out >= request.stdout and err >= request.stderr:
                break
            time.sleep(0.005)
        run.show_output()

    def _answer(self, run: RunView, request: InputRequest) -> str | None:
        """The user's line for `request`; None when the user switched to another rank."""
        if self._no_stdin:
            return SKIP
        if request.rank != self.current and request.kind is AskKind.DEBUGGER:
            others = sorted(set(self.pending) - {request.rank})
            more = f"; also stopped: {', '.join(map(str, others))}" if others else ""
            print(
                f"distnb: rank {request.rank} stopped at {request.where}{more} "
                "(`ranks` lists every rank, `rank N` switches)",
                flush=True,
            )
        while True:
            try:
                line = self._input(f"[rank {request.rank}] {request.prompt}", request.kind)
            except KeyboardInterrupt:
                print(f"distnb: interrupted: rank {request.rank} leaves the debugger", flush=True)
                return QUIT
            except (EOFError, OSError, NotImplementedError):  # no stdin after all
                self._no_stdin = True
                return SKIP
            if request.kind is not AskKind.DEBUGGER:
                return line
            if line.strip() == "ranks":
                print(self._where_ranks(run, request), flush=True)
                continue
            switch = _SWITCH.match(line)
            if switch is None:
                return line
            other = int(switch.group(1))
            if other == request.rank:
                continue
            if other in self.pending:
                self.current = other
                return None
            print(f"distnb: rank {other} is not stopped; {self._where_ranks(run, request)}")

    def _input(self, prompt: str, kind: AskKind) -> str:
        if kind is AskKind.PASSWORD:
            return getpass.getpass(prompt)  # ipykernel's: the frontend hides what is typed
        return builtins.input(prompt)

    def _where_ranks(self, run: RunView, asking: InputRequest) -> str:
        states = run.states()
        words = run.beacon_words()
        stopped = {**self.pending, asking.rank: asking}
        lines = []
        for rank in sorted(states):
            if rank in stopped:
                where = stopped[rank].where
                what = f"stopped in the debugger at {where}" if where else "stopped"
                what += " (this prompt)" if rank == asking.rank else ""
            elif states[rank] is RankState.RUNNING:
                what = words.get(rank, "running")
            else:
                what = states[rank].value
            lines.append(f"  rank {rank}: {what}")
        return "where the ranks are:\n" + "\n".join(lines)
