"""Running one cell on many ranks: the wait loop, output, errors, timeouts and interrupts.

The kernel's main thread waits here in short slices, woken by ipyparallel's result callbacks, so
it can show output live, notice a dead rank at once, honour the cell's deadline and turn Ctrl-C
into an interrupt of the ranks. Everything a rank sends back is translated once, here, into
distnb's own records and exceptions.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from distnb import errors
from distnb.ranklist import format_ranks
from distnb.records.cell import RankFailure, RankInfo, RankReport, RankState
from distnb.session.cluster import Cluster
from distnb.session.control import ControlPlane
from distnb.views.output import CellOutput, RankOutput

# How long ranks get to stop after an interrupt before distnb says they are stuck.
INTERRUPT_GRACE_S = 3.0
# How long the other ranks get to finish once one rank has died.
DEATH_GRACE_S = 1.0
# Ranks write a beacon only once a wait has lasted 5 ms: before then there is nothing to referee,
# and a short cell need not pay for reading the store.
REFEREE_AFTER_S = 0.005
# How long to wait for a finished rank's last output messages.
OUTPUT_WAIT_S = 2.0


@dataclass(frozen=True, slots=True)
class CellResult:
    """What a cell did on each rank: its output, in rank order."""

    cell: int
    outputs: tuple[RankOutput, ...]

    def stdout(self, rank: int) -> str:
        return next(o.stdout for o in self.outputs if o.rank == rank)

    def result(self, rank: int) -> str | None:
        """The rank's last-expression value as text, if the cell ended with one."""
        out = next(o for o in self.outputs if o.rank == rank)
        for content in reversed(out.displays):
            if content.get("execute_result"):
                return str(content.get("data", {}).get("text/plain"))
        return None


class Referee:
    """Watches a running cell from the kernel; the checked runtime plugs in here.

    `tick` runs on every wake of the wait loop with the ranks' states so far; `waiters` keeps,
    per run id, the beacons of the ranks it released.
    """

    waiters: dict[int, list[dict[str, Any]]]

    def __init__(self) -> None:
        self.waiters = {}

    def tick(self, run_id: int, states: dict[int, RankState], failures: dict[int, str]) -> None:
        pass


class CellRun:
    """One cell on a set of ranks; `wait()` returns its result or raises its error."""

    def __init__(
        self,
        cluster: Cluster,
        control: ControlPlane,
        targets: Sequence[RankInfo],
        cell: int,
        run_id: int,
        check: bool,
        code: str,
        timeout: float | None,
        referee: Referee,
        on_death: Callable[[RankInfo, str], None],
    ) -> None:
        self.cluster = cluster
        self.control = control
        self.targets = list(targets)
        self.cell = cell
        self.run_id = run_id
        self.timeout = timeout
        self.referee = referee
        self.on_death = on_death
        self._wake = threading.Event()
        control.begin_cell(cell, run_id, check)
        self.results: dict[int, Any] = {}
        for info in self.targets:
            ar = cluster.view(info.engine_id).execute(code, silent=False, block=False)
            ar.add_done_callback(lambda _f: self._wake.set())
            self.results[info.rank] = ar
        self.output = CellOutput([t.rank for t in self.targets])

    def wait(self) -> CellResult:
        start = time.monotonic()
        deadline = start + self.timeout if self.timeout is not None else None
        try:
            while not self._all_done():
                self._wake.wait(0.05)
                self._wake.clear()
                if self.output.live:
                    self.output.update(self._outputs())
                states, failures = self._states()
                if RankState.DIED in states.values():
                    self._settle_after_death()
                    break
                if time.monotonic() - start >= REFEREE_AFTER_S:
                    self.referee.tick(self.run_id, states, failures)
                if deadline is not None and time.monotonic() >= deadline:
                    self._raise_timeout(time.monotonic() - start)
        except KeyboardInterrupt:
            stuck = self._interrupt(self._running())
            self.output.finish(self._outputs())
            if stuck:
                print(_stuck_message(stuck), file=__import__("sys").stderr)
            raise
        for ar in self.results.values():
            # iopub output may trail the reply: wait for the engine's idle status
            ar.wait_for_output(timeout=OUTPUT_WAIT_S)
        outputs = self._outputs()
        self.output.finish(outputs)
        self._raise_failures()
        return CellResult(self.cell, tuple(outputs))

    # --- state ---------------------------------------------------------------------------

    def _all_done(self) -> bool:
        return all(ar.done() for ar in self.results.values())

    def _running(self) -> list[RankInfo]:
        return [t for t in self.targets if not self.results[t.rank].done()]

    def _states(self) -> tuple[dict[int, RankState], dict[int, str]]:
        states: dict[int, RankState] = {}
        failures: dict[int, str] = {}
        for rank, ar in self.results.items():
            if not ar.done():
                states[rank] = RankState.RUNNING
                continue
            error = _error_of(ar)
            if error is None:
                states[rank] = RankState.FINISHED
            elif getattr(error, "ename", "") == "EngineError":
                states[rank] = RankState.DIED
            else:
                states[rank] = RankState.FAILED
                failures[rank] = f"{error.ename}: {error.evalue}"
        return states, failures

    def _outputs(self) -> list[RankOutput]:
        outputs = []
        for info in self.targets:
            md = _live_metadata(self.results[info.rank])
            displays = list(md["outputs"])
            if md["execute_result"]:
                displays.append({**md["execute_result"], "execute_result": True})
            outputs.append(RankOutput(info.rank, md["stdout"], md["stderr"], displays))
        return outputs

    # --- endings ---------------------------------------------------------------------------

    def _raise_failures(self) -> None:
        failures = []
        died = []
        for info in self.targets:
            error = _error_of(self.results[info.rank])
            if error is None:
                continue
            if getattr(error, "ename", "") == "EngineError":
                died.append(info)
            else:
                failures.append(_failure(info.rank, error))
        if died:
            self._raise_died(died, failures)
        if failures:
            raise _rank_error(self.cell, failures)

    def _raise_died(self, died: list[RankInfo], failures: list[RankFailure]) -> None:
        lines = []
        for info in died:
            how = _exit_text(self.cluster.exit_status(info.pid))
            log = self.cluster.log_tail(info.pid, lines=3)
            self.on_death(info, how)
            lines.append(
                f"rank {info.rank} (pid {info.pid} on {info.host}) {how} in cell In[{self.cell}]"
            )
            if log:
                lines.append("  its last log lines:\n    " + log.replace("\n", "\n    "))
            failures.append(RankFailure(info.rank, "RankDied", how, ""))
        message = (
            "\n".join(lines)
            + "\nThe process group lost a member: run %dist_restart (or session.restart())."
        )
        raise errors.RankDiedError(message, failures)

    def _settle_after_death(self) -> None:
        """Give the surviving ranks a moment to finish, then interrupt them."""
        deadline = time.monotonic() + DEATH_GRACE_S
        while not self._all_done() and time.monotonic() < deadline:
            self._wake.wait(0.05)
            self._wake.clear()
        self._interrupt(self._running())

    def _raise_timeout(self, elapsed: float) -> None:
        running = self._running()
        stacks = self.control.stacks([t.rank for t in running])
        waits = {
            int(b["rank"]): f"waiting at {b['op']} #{b['seq']} on {b['group']} ({b['site']}) "
            f"for {format_ranks(b.get('waiting_for', ()))}"
            for b in self.control.beacons([t.rank for t in running])
            if b.get("state") == "waiting" and b.get("cell") == self.run_id
        }
        reports = []
        for info in self.targets:
            ar = self.results[info.rank]
            if not ar.done():
                stack = stacks.get(
                    info.rank,
                    "(no stack: the rank did not answer; it may be "
                    "blocked in native code holding the GIL)",
                )
                detail = waits.get(info.rank, "still running")
                reports.append(RankReport(info.rank, RankState.RUNNING, detail, stack))
            elif (error := _error_of(ar)) is not None:
                reports.append(
                    RankReport(info.rank, RankState.FAILED, f"{error.ename}: {error.evalue}")
                )
            else:
                reports.append(RankReport(info.rank, RankState.FINISHED))
        stuck = self._interrupt(running)
        self.output.finish(self._outputs())
        message = (
            f"cell In[{self.cell}] still running on {format_ranks(t.rank for t in running)} "
            f"after {elapsed:.1f} s (timeout {self.timeout:g} s). "
        )
        if stuck:
            message += _stuck_message(stuck)
        else:
            message += "The running ranks were interrupted; the cluster is ready."
        raise errors.RankTimeoutError(message, reports)

    def _interrupt(self, running: list[RankInfo]) -> list[RankInfo]:
        """SIGINT the running ranks; return those still running after the grace period."""
        if not running:
            return []
        self.cluster.signal(signal.SIGINT, [t.engine_id for t in running])
        deadline = time.monotonic() + INTERRUPT_GRACE_S
        while time.monotonic() < deadline and any(not self.results[t.rank].done() for t in running):
            self._wake.wait(0.05)
            self._wake.clear()
        return [t for t in running if not self.results[t.rank].done()]


def _live_metadata(ar: Any) -> Any:
    """The dict of an engine's output that grows as iopub messages arrive.

    `AsyncResult.metadata` returns it too, but first parses its four timestamps with dateutil
    on every access (~0.4 ms per rank, a tenth of an empty cell's round trip); distnb reads no
    timestamps, so it takes the dict as ipyparallel 9 keeps it, and falls back to the property.
    """
    stored = getattr(ar, "_metadata", None)
    return stored[0] if isinstance(stored, list) and stored else ar.metadata


def assigned_names(code: str) -> list[str]:
    """Top-level names a cell binds (`x = ...`, `for x in`, `with ... as x`, `def x`), in order."""
    import ast

    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    names: dict[str, None] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names[node.id] = None
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = None
    return list(names)


def _error_of(ar: Any) -> Any:
    """The RemoteError of a finished single-engine AsyncResult, or None if it succeeded."""
    try:
        ar.get(timeout=0)
    except Exception as exc:
        return exc
    return None


def _failure(rank: int, error: Any) -> RankFailure:
    tb = error.traceback if isinstance(getattr(error, "traceback", None), str) else ""
    return RankFailure(
        rank,
        getattr(error, "ename", type(error).__name__),
        str(getattr(error, "evalue", error)),
        tb,
    )


_RANK_ERRORS: dict[str, type[errors.RankError]] = {
    "CollectiveMismatchError": errors.CollectiveMismatchError,
    "CollectiveDesyncError": errors.CollectiveDesyncError,
}


def _rank_error(cell: int, failures: list[RankFailure]) -> errors.RankError:
    """One exception for the cell. The checked runtime's errors are raised as themselves when
    every failing rank raised one; when a rank raised an error of its own, that is the cause
    (the others' `CollectiveDesyncError`s only follow from it), so it comes first."""
    own = [f for f in failures if f.ename not in _RANK_ERRORS]
    if not own:
        first = min(failures, key=lambda f: (f.ename != "CollectiveMismatchError", f.rank))
        return _RANK_ERRORS[first.ename](first.evalue, failures)
    groups = errors.group_failures(own) + errors.group_failures(
        [f for f in failures if f.ename in _RANK_ERRORS]
    )
    summary = "; ".join(
        f"{format_ranks(r)}: {f.summary}" for r, f in groups[: errors.TRACEBACK_LIMIT]
    )
    more = len(groups) - errors.TRACEBACK_LIMIT
    if more > 0:
        summary += f"; ... {more} more"
    return errors.RankError(f"cell In[{cell}] failed on {summary}", failures)


def _exit_text(code: int | None) -> str:
    if code is None:
        return "died (exit status unknown)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with code {code}"


def _stuck_message(stuck: list[RankInfo]) -> str:
    return (
        f"{format_ranks(t.rank for t in stuck)} did not stop after an interrupt (blocked in "
        "native code, e.g. a collective whose peer is gone): run %dist_restart "
        "(or session.restart()) to get a working cluster."
    )
