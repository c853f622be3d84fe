"""The kernel's end of stopped ranks: their prompts asked in the notebook, one at a time.

A rank stopped in its debugger (or calling `input()`) posts an `InputRequest` to the control
plane (`distnb.rank.debug`). While a cell runs, its wait loop hands those requests to `Desk.serve`,
which shows what the rank printed so far, asks the user through the kernel's own `input()` (the
frontend's input box, the terminal's prompt), and posts the answer back. The cell's clock stops
meanwhile: time spent with the user does not count towards its timeout.

Several stopped ranks are asked in rank order, one prompt at a time; the rank at hand keeps the
prompt while it steps (`n`, `s`), and gives it up when it continues or quits. Three commands are
the desk's own, at any debugger prompt: `ranks` lists where every rank is, `rank N` switches to
another stopped rank (and says where it stopped), and `ranks SELECTION COMMAND` sends COMMAND to
several stopped ranks at once (`many`), showing their answers grouped. An interrupt at a prompt
quits that rank's debugger; a frontend that takes no input (nbconvert, papermill,
`allow_stdin=False`) gets every prompt answered with `SKIP`.

The transcript reads in order: from the first prompt on, the run's output is printed below as it
comes (`RunView.show_output`) rather than redrawn in the areas above, so the rank's output, each
command and its answer follow each other as they happened.
"""

from __future__ import annotations

import builtins
import getpass
import re
import sys
import time
from typing import Protocol

from distnb import interrupts
from distnb.ranklist import format_ranks
from distnb.records.cell import RankState
from distnb.records.debug import QUIT, SKIP, AskKind, InputRequest
from distnb.session.debugger import many
from distnb.session.load import stretched

__all__ = ["Desk", "Prompts", "RunView", "frontend_stdin"]

# How long the rank at hand gets to stop again after a stepping command before another stopped
# rank gets the prompt (a step over a long call may take longer: the other rank goes first).
STEP_GRACE_S = 0.5
# How long a rank's output may trail its prompt (iopub and the store are separate channels):
# on a loaded machine longer, up to OUTPUT_MOST_S (the wait ends once the output is in).
OUTPUT_WAIT_S = 2.0
OUTPUT_MOST_S = 30.0
# How long the first prompt of a run, and `ranks ... CMD`, wait for ranks still on their way to
# a stop (so that ranks stopping together are asked in rank order, and a command reaches them);
# on a loaded machine longer, up to GATHER_MOST_S (the wait ends once no rank is on its way).
GATHER_S = 1.0
GATHER_MOST_S = 10.0
# How long it waits for the ranks' answers before it shows those it has.
ANSWERS_WAIT_S = 30.0
# Debugger commands after which the rank runs on rather than stopping again at once.
_RUNS_ON = re.compile(r"\s*(c|cont|continue|q|quit|exit|EOF)\s*$")
_SWITCH = re.compile(r"\s*rank\s+(\d+)\s*$")


# The user's answer was sent by the desk itself (to several ranks at once).
_SENT = "\0sent"


class Prompts(Protocol):
    """Where the ranks' prompts come from and their answers go: the session's control plane
    (`distnb.session.control.ControlPlane`), or an attached job's (`distnb.session.attach`)."""

    def asks(self) -> list[InputRequest]: ...
    def answer(self, n: int, line: str) -> None: ...


class RunView(Protocol):
    """What the desk needs of the running cell (`distnb.session.runs.run.CellRun`)."""

    def states(self) -> dict[int, RankState]: ...
    def written(self, rank: int) -> tuple[int, int]: ...
    def show_output(self) -> None:
        """Show every rank's output so far; from now on, print it below as it comes."""

    def take_output(self, upto: dict[int, tuple[int, int]]) -> dict[int, str]:
        """Each rank's output not shown yet, up to its (stdout, stderr) counts, now shown."""
        ...

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

    def __init__(self, control: Prompts, run_id: int):
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
        if self.current is None:  # the run's first stop: its peers may be stopping too
            self._gather(run, min(self.pending))
        while self.pending:
            rank = self._next_rank()
            request = self.pending.pop(rank)
            self._show_up_to(run, request)
            self._collect()  # ranks that stopped meanwhile are named with this prompt
            answer = self._answer(run, request)
            if answer is None:  # the user switched ranks; this prompt stays open
                self.pending[rank] = request
                continue
            if answer != _SENT:
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
        deadline = time.monotonic() + stretched(OUTPUT_WAIT_S, OUTPUT_MOST_S)
        while time.monotonic() < deadline:
            out, err = run.written(request.rank)
            if out >= request.stdout and err >= request.stderr:
                break
            time.sleep(0.005)
        run.show_output()

    def _answer(self, run: RunView, request: InputRequest) -> str | None:
        """The user's line for `request`; None when the user switched to another rank (or sent
        a command to other ranks), `_SENT` when the desk sent it to several ranks itself."""
        if self._no_stdin:
            return SKIP
        if request.rank != self.current and request.kind is AskKind.DEBUGGER:
            others = sorted(set(self.pending) - {request.rank})
            more = f"; also stopped: {_numbers(others)}" if others else ""
            to_all = ", `ranks all CMD` sends CMD to every stopped rank" if others else ""
            print(
                f"distnb: rank {request.rank} stopped at {request.where}{more} "
                f"(`ranks` lists every rank, `rank N` switches{to_all})",
                flush=True,
            )
        while True:
            try:
                with interrupts.let_through():  # the cell's wait holds Ctrl-C; a prompt not
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
            try:
                command = many.parse(line)
            except ValueError as exc:
                print(f"distnb: {exc}", flush=True)
                continue
            if command is not None:
                sent = self._to_many(run, request, *command)
                if sent is None:
                    continue
                return _SENT if sent else None
            switch = _SWITCH.match(line)
            if switch is None:
                return line
            other = int(switch.group(1))
            if other == request.rank:
                continue
            if other in self.pending:
                self.current = other
                print(f"distnb: rank {other} stopped at {self.pending[other].where}", flush=True)
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
                mesh = stopped[rank].mesh
                what += f" [{', '.join(f'{d}={c}' for d, c in mesh.items())}]" if mesh else ""
            elif states[rank] is RankState.RUNNING:
                what = words.get(rank, "running")
            else:
                what = states[rank].value
            lines.append(f"  rank {rank}: {what}")
        return "where the ranks are:\n" + "\n".join(lines)

    # --- one command to several ranks --------------------------------------------------------

    def _to_many(
        self, run: RunView, asking: InputRequest, selection: many.Selection, command: str
    ) -> bool | None:
        """Send `command` to the stopped ranks `selection` names and show their answers.

        True when `asking`'s prompt was among them (answered), False when it stays open, None
        when no rank took the command."""
        self._gather(run, asking.rank)
        stopped = {**self.pending, asking.rank: asking}
        targets, note = many.select(selection, stopped, sorted(run.states()))
        if note:
            print(f"distnb: {note}", flush=True)
        if not targets:
            print(f"distnb: no stopped rank in {selection}; {many.USAGE}", flush=True)
            return None
        run.show_output()
        self.current = asking.rank  # the prompt stays with the rank at hand
        for rank in targets:
            self.pending.pop(rank, None)
            self.control.answer(stopped[rank].n, command)
        self._runs_on = bool(_RUNS_ON.match(command))
        if self._runs_on:
            print(f"distnb: {format_ranks(targets)} go on ({command.strip()})", flush=True)
        else:
            print(many.group_answers(self._answers(run, targets)), end="", flush=True)
        return asking.rank in targets

    def _gather(self, run: RunView, asking: int) -> None:
        """Give ranks on their way to a stop a moment to get there (every rank of a training
        step reaches its `breakpoint()` within moments of the first)."""
        deadline = time.monotonic() + stretched(GATHER_S, GATHER_MOST_S)
        while time.monotonic() < deadline:
            self._collect()
            states = run.states()
            stopped = {*self.pending, asking}
            on_the_way = [
                r for r, s in states.items() if s is RankState.RUNNING and r not in stopped
            ]
            if not on_the_way:
                return
            words = run.beacon_words()
            if all(words.get(r, "").startswith("waiting") for r in on_the_way):
                return  # they wait at a collective for the stopped ranks
            time.sleep(0.01)

    def _answers(self, run: RunView, targets: list[int]) -> dict[int, str]:
        """What each of `targets` printed for the command it was sent, up to its next prompt."""
        waiting, notes = set(targets), {}
        deadline = time.monotonic() + ANSWERS_WAIT_S
        looked = 0.0
        while waiting and time.monotonic() < deadline:
            time.sleep(0.005)
            self._collect()
            states = run.states()
            waiting = {r for r in waiting if r not in self.pending}
            waiting = {r for r in waiting if states.get(r) is RankState.RUNNING}
            if waiting and time.monotonic() - looked > 0.1:
                looked, words = time.monotonic(), run.beacon_words()
                held = {r: words[r] for r in waiting if words.get(r, "").startswith("waiting")}
                notes.update({r: f"(distnb: {w})\n" for r, w in held.items()})
                waiting -= set(held)
        notes.update({r: "(distnb: still running the command)\n" for r in waiting})
        upto = {r: (q.stdout, q.stderr) for r, q in self.pending.items() if r in targets}
        out_deadline = time.monotonic() + stretched(OUTPUT_WAIT_S, OUTPUT_MOST_S)
        for rank in targets:
            counts = upto.get(rank)
            while counts is not None and time.monotonic() < out_deadline:
                out, err = run.written(rank)
                if out >= counts[0] and err >= counts[1]:
                    break
                time.sleep(0.005)
            if counts is None:  # no prompt came: whatever arrived
                upto[rank] = run.written(rank)
        texts = run.take_output(upto)
        return {r: texts.get(r, "") + notes.get(r, "") for r in targets}


def _numbers(ranks: list[int]) -> str:
    """`0-3,6`: the ranks as `format_ranks` spells them, without the word."""
    return format_ranks(ranks).split(" ", 1)[1]
