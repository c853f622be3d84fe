"""Running one cell on many ranks: the wait loop, output, errors, timeouts and interrupts.

The kernel's main thread waits here in short slices, woken by ipyparallel's result callbacks, so
it can show output live, notice a dead rank at once, honour the cell's deadline and turn Ctrl-C
into an interrupt of the ranks. What ranks send back is translated by `failures`; the errors
that end a run early are built by `endings`.
"""

from __future__ import annotations

import functools
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable

from distnb import errors, interrupts
from distnb.contract import keys
from distnb.judgement.circles import held_up_by
from distnb.ranklist import format_ranks
from distnb.records.beacon import BeaconState
from distnb.records.cell import RankFailure, RankInfo, RankState
from distnb.session.cluster import Cluster
from distnb.session.cluster.deaths import death_reason
from distnb.session.cluster.members import Member, Role
from distnb.session.control import ControlPlane
from distnb.session.debugger import visual
from distnb.session.debugger.desk import Desk, frontend_stdin
from distnb.session.load import stretched
from distnb.session.runs import endings
from distnb.session.runs.failures import engine_died, error_of, stuck_message, to_failure
from distnb.session.runs.referee import DesyncReferee
from distnb.session.runs.request import CellRequest, CellResult
from distnb.session.runs.streams import Reply, StreamLog, Tally, execute, wait_for_outputs
from distnb.views.output import CellOutput, RankOutput

# How long ranks get to stop after an interrupt before distnb says they are stuck, on a quiet
# machine; a busy one stretches it (`load.stretched`), up to INTERRUPT_GRACE_MAX_S.
INTERRUPT_GRACE_S = 3.0
INTERRUPT_GRACE_MAX_S = 15.0
# How long the other ranks get to finish once one rank has died.
DEATH_GRACE_S = 1.0
# How often a running cell reads the ranks' prompts and beacons from the store: ranks write a
# beacon only once a wait has lasted 5 ms (before then there is nothing to referee, and a short
# cell need not pay for reading the store), and a read on every wake (one per finishing rank)
# would read N keys N times a cell.
LOOK_EVERY_S = 0.005
# How long to wait for a finished rank's last output messages.
OUTPUT_WAIT_S = 2.0
# How often a running cell looks for dead processes (one poll() of their pidfds, ~5 us).
DEATHS_EVERY_S = 0.1


class CellRun:
    """One cell on a set of ranks: `start()` sends it, `wait()` returns its result.

    `wait()` raises only what ends a cell early: `RankTimeoutError`, `RankDiedError`,
    `SessionError` (a process the cluster needs is gone: the controller, a nanny), or
    `CellInterrupted`, a KeyboardInterrupt that says where each rank was (after interrupting
    the ranks); ranks' own exceptions come back on the result as failures, for the session to
    turn into one error. `on_death` is told why the session is broken when a process dies.
    """

    def __init__(
        self,
        cluster: Cluster,
        control: ControlPlane,
        request: CellRequest,
        referee: DesyncReferee | None,
        on_death: Callable[[str], None],
    ) -> None:
        self.cluster = cluster
        self.control = control
        self.request = request
        self.targets = list(request.targets)
        self.referee = referee
        self.on_death = on_death
        self._wake = threading.Event()
        self.results: dict[int, Reply] = {}
        self.logs: dict[int, StreamLog] = {}  # each rank's writes, in the order written
        self._tally = Tally()  # how many writes arrived, all ranks together
        self._writes = 0  # how many of them the output has been given
        # Each rank's state, in rank order, and a failed rank's error summary: a rank is looked
        # at once, when its reply arrives (`_ended`, filled on ipyparallel's I/O thread), not at
        # every wake: a wake costs the same at 16 ranks as at 2.
        self._state: dict[int, RankState] = {}
        self._failed: dict[int, str] = {}
        self._ended: deque[int] = deque()
        self._left = 0  # ranks whose reply has not been looked at
        self._died = False  # a rank's engine died while it ran the request
        self.output: CellOutput | None = None
        self.desk = Desk(control, request.run_id)
        self.paused_s = 0.0  # time spent with the user at ranks' prompts: not the cell's
        self.visual = visual.active()  # JupyterLab's debugger, attached to the ranks
        self._visual_s = 0.0
        # the ranks interrupted because a peer died, and where each was (the user's line)
        self._survivors: dict[int, str] = {}

    def start(self) -> CellRun:
        req = self.request
        self._check_deaths()  # a process that died since the last cell
        self.cluster.members.mark_logs(t.pid for t in self.targets)
        self.control.begin_run(req.cell, req.run_id, req.check, frontend_stdin(), req.everyone)
        # the file JupyterLab's debugger knows an %%allranks cell by: ranks compile it so
        self.control.post(keys.CELL_FILE, visual.cell_file())  # again if a stranger overwrites it
        if self.visual is not None:
            self.visual.begin_run(self.cluster, self.targets, self.control, req.run_id)
            self._visual_s = self.visual.stopped_seconds()
        self.logs = {info.rank: StreamLog(self._wake, self._tally) for info in self.targets}
        views = {info.rank: self.cluster.view(info.engine_id) for info in self.targets}
        self.results = execute(views, req.code, self.logs)
        self._state = dict.fromkeys(self.results, RankState.RUNNING)
        self._left = len(self.results)
        for rank, reply in self.results.items():
            reply.add_done_callback(functools.partial(self._end, rank))
        self.output = CellOutput([t.rank for t in self.targets])
        return self

    def wait(self) -> CellResult:
        __tracebackhide__ = True  # IPython leaves this frame out of tracebacks
        # Ctrl-C is taken once per slice, never inside ipyparallel's or threading's locks
        # (`interrupts`): a KeyboardInterrupt there could leave one held and hang the kernel
        with interrupts.held() as noted:
            return self._wait(noted)

    def _wait(self, noted: interrupts.Held) -> CellResult:
        __tracebackhide__ = True
        assert self.output is not None, "start() the run first"
        timeout = self.request.timeout
        start = time.monotonic()
        deadline = start + timeout if timeout is not None else None
        looked = read = start
        try:
            while not self._all_done():
                noted.check()
                self._wake.wait(0.05)
                noted.check()
                self._wake.clear()
                if self.output.live and self._output_due():
                    self.output.update(self._outputs(), self._printing)
                due = time.monotonic() - read >= LOOK_EVERY_S
                read = time.monotonic() if due else read
                # a rank that waits for an answer is not done: nothing to serve once all are
                paused = self.desk.serve(self) if due and not self._all_done() else 0.0
                if self.visual is not None:  # ranks stopped in JupyterLab's debugger
                    stopped, self._visual_s = self._visual_s, self.visual.stopped_seconds()
                    paused += self._visual_s - stopped
                if paused:  # the cell's clock stops while the user answers a rank's prompt
                    self.paused_s += paused
                    deadline = deadline + paused if deadline is not None else None
                states, failures = self._states()
                if self._died:
                    self._settle_after_death()
                    break
                if time.monotonic() - looked >= DEATHS_EVERY_S:
                    self._check_deaths()
                    looked = time.monotonic()
                if self.referee is not None and due:
                    self.referee.tick(self.request, states, failures)
                if deadline is not None and time.monotonic() >= deadline:
                    self._raise_timeout(time.monotonic() - start - self.paused_s)
        except KeyboardInterrupt:
            running = self._running()
            where = self._where_running(running)
            stuck = self._interrupt(running)
            self.output.finish(self._outputs())
            if stuck:
                print(stuck_message(t.rank for t in stuck), file=sys.stderr)
            raise errors.CellInterrupted(where) from None
        # iopub output may trail the reply: wait for each engine's idle status
        wait_for_outputs(self.results.values(), timeout=OUTPUT_WAIT_S)
        outputs = self._outputs()
        self.output.finish(outputs)
        for out in outputs:  # the result keeps what arrived until now
            out.writes = tuple(out.writes)
        ended = self._failures()
        self.cluster.members.mark_logs(t.pid for t in self.targets)
        return CellResult(self.request.cell, self.request.run_id, tuple(outputs), ended)

    # --- state ---------------------------------------------------------------------------

    def states(self) -> dict[int, RankState]:
        return dict(self._states()[0])

    def written(self, rank: int) -> tuple[int, int]:
        """How many characters of the rank's stdout and stderr the kernel has received."""
        return self.logs[rank].written()

    def show_output(self) -> None:
        """Show what every rank printed so far (before a prompt); from now on, print it below
        as it comes, so that the prompts and answers read in order."""
        assert self.output is not None
        self.output.progress(self._outputs())
        self.output.hold()

    def take_output(self, upto: dict[int, tuple[int, int]]) -> dict[int, str]:
        """Each rank's output not shown yet, up to its counts, now counted as shown."""
        assert self.output is not None
        return self.output.take(self._outputs(), upto)

    def beacon_words(self) -> dict[int, str]:
        """What each running rank's beacon says it waits at (or that it is stopped in the
        debugger), for this run."""
        words = {}
        beacons = self.control.beacons([t.rank for t in self._running()])
        for b in beacons:
            if b.run_id != self.request.run_id:
                continue
            if b.waiting:
                words[b.rank] = f"waiting at {b.where()} for {format_ranks(held_up_by(b, beacons))}"
            elif b.state is BeaconState.STOPPED:
                words[b.rank] = f"stopped in {b.where()}"
        return words

    def _where_running(self, running: list[RankInfo]) -> str:
        """`interrupted: rank 0 at cell In[3] line 5, rank 1 waiting at ...`: where each rank
        still running was when the user interrupted the cell."""
        if not running:
            return "interrupted"
        ranks = [t.rank for t in running]
        waits = self.beacon_words()
        stacks = self.control.stacks([r for r in ranks if r not in waits], timeout=0.5)
        return endings.where_running(self.request.where, ranks, waits, stacks)

    def _end(self, rank: int, _reply: object = None) -> None:
        """A rank's reply arrived (ipyparallel's I/O thread, or here if it had already)."""
        self._ended.append(rank)
        self._wake.set()

    def _all_done(self) -> bool:
        return not self._look_at_ended()

    def _look_at_ended(self) -> int:
        """Note the state of each rank whose reply arrived since the last look; how many ranks
        are still running."""
        while self._ended:
            rank = self._ended.popleft()
            error = error_of(self.results[rank])
            if error is None:
                self._state[rank] = RankState.FINISHED
            elif engine_died(error):
                self._state[rank] = RankState.DIED
                self._died = True
            else:
                self._state[rank] = RankState.FAILED
                self._failed[rank] = to_failure(rank, error).summary
            self._left -= 1
        return self._left

    def _running(self) -> list[RankInfo]:
        return [t for t in self.targets if not self.results[t.rank].done()]

    def _output_due(self) -> bool:
        """Whether there is output to show: writes arrived, or lines wait in a terminal."""
        assert self.output is not None
        writes = self._tally.count
        due, self._writes = writes != self._writes or self.output.holding(), writes
        return due

    def _printing(self) -> list[int]:
        """The ranks whose output may still come: output can trail a rank's result, until its
        engine says it is idle."""
        return [rank for rank, ar in self.results.items() if not ar.wait_for_output(0)]

    def _states(self) -> tuple[dict[int, RankState], dict[int, str]]:
        """Each rank's state in rank order, and each failed rank's error summary (the run's
        own: read, not changed)."""
        self._look_at_ended()
        return self._state, self._failed

    def _outputs(self) -> list[RankOutput]:
        outputs = []
        for info in self.targets:
            md = self.results[info.rank].metadata  # grows as iopub messages arrive
            displays = list(md["outputs"])
            if md["execute_result"]:
                displays.append({**md["execute_result"], "execute_result": True})
            # the log itself, not a copy: the output reads only the part it has not seen
            writes = self.logs[info.rank].writes
            outputs.append(RankOutput(info.rank, md["stdout"], md["stderr"], displays, writes))
        return outputs

    # --- endings ---------------------------------------------------------------------------

    def _failures(self, lost: RankInfo | None = None) -> tuple[RankFailure, ...]:
        """Each failing rank's error; a rank that died (or `lost`, whose engine is gone) raises
        `RankDiedError` here."""
        failures = []
        died = [lost] if lost is not None else []
        for info in self.targets:
            ar = self.results.get(info.rank)
            error = error_of(ar) if ar is not None else None
            if error is None or info in died:
                continue
            if engine_died(error):
                died.append(info)
            else:
                failures.append(to_failure(info.rank, error))
        if died:
            self._raise_died(sorted(died, key=lambda t: t.rank), failures)
        return tuple(failures)

    def _raise_died(self, died: list[RankInfo], failures: list[RankFailure]) -> None:
        # Before the cell was sent, a rank died after the last cell: no line of this one.
        sent = self.output is not None
        when = f" in {self.request.where}" if sent else f" before {self.request.where}"
        members = self.cluster.members
        hows = {info.rank: members.how_died(info.pid, info.here) for info in died}
        first = Member(died[0].pid, Role.ENGINE)
        self.on_death(death_reason(first, hows[died[0].rank], self.targets, when))
        interrupted = [f for f in failures if f.rank in self._survivors]
        failures = [f for f in failures if f.rank not in self._survivors]
        failures += [endings.interrupted_by_death(f, self._survivors[f.rank]) for f in interrupted]
        raise endings.died_error(
            died, hows, when, self.request.code if sent else None, members, failures
        )

    def _check_deaths(self) -> None:
        """Raise if a process the cluster needs has died: a rank's engine as `RankDiedError`,
        the controller or a nanny as `SessionError` (no rank could tell: ipyparallel only
        learns of an engine's death from its nanny, and cells run through the controller)."""
        gone = self.cluster.members.dead()
        if gone is None:
            return
        by_pid = {t.pid: t for t in self.targets}
        if self.output is not None:
            if gone.role is Role.ENGINE and gone.pid in by_pid:
                self._settle_after_death()
            self.output.finish(self._outputs())
        if gone.role is Role.ENGINE and gone.pid in by_pid:
            self._failures(by_pid[gone.pid])
        where = self.request.where
        when = f" while {where} ran" if self.output is not None else f" before {where}"
        how = self.cluster.members.how_died(gone.pid)
        reason = death_reason(gone, how, self.targets, when)
        self.on_death(reason)
        raise errors.SessionError(reason)

    def _settle_after_death(self) -> None:
        """Give the surviving ranks a moment to finish, then interrupt them."""
        deadline = time.monotonic() + DEATH_GRACE_S
        while not self._all_done() and time.monotonic() < deadline:
            self._wake.wait(0.05)
            self._wake.clear()
        running = self._running()
        if running:  # where each was, in the user's words: their tracebacks would be ours
            waits = self.beacon_words()
            stacks = self.control.stacks([t.rank for t in running if t.rank not in waits], 0.5)
            self._survivors = {
                t.rank: waits.get(t.rank) or stacks.get(t.rank, "").split("\n", 1)[0] or "running"
                for t in running
            }
        self._interrupt(running)

    def _raise_timeout(self, elapsed: float) -> None:
        running = self._running()
        # A stopped process (SIGSTOP, a debugger) answers nothing: no stack to wait for.
        stopped = [t for t in running if self.cluster.members.stopped(t.pid)]
        stacks = self.control.stacks([t.rank for t in running if t not in stopped])
        waits = self.beacon_words()
        ended = {}  # a done rank's error, "" for one that finished
        for rank, ar in self.results.items():
            if ar.done():
                error = error_of(ar)
                ended[rank] = to_failure(rank, error).summary if error is not None else ""
        # A stopped rank is not interrupted: the signal would wait until it is continued and
        # then land in whatever cell it runs by then.
        stuck = self._interrupt([t for t in running if t not in stopped])
        assert self.output is not None
        self.output.finish(self._outputs())
        raise endings.timeout_error(
            self.request, elapsed, running, stopped, stuck, stacks, waits, ended
        )

    def _interrupt(self, running: list[RankInfo]) -> list[RankInfo]:
        """SIGINT the running ranks; return those still running after the grace period."""
        if not running:
            return []
        self.cluster.signal(signal.SIGINT, [t.engine_id for t in running])
        deadline = time.monotonic() + stretched(INTERRUPT_GRACE_S, INTERRUPT_GRACE_MAX_S)
        while time.monotonic() < deadline and any(not self.results[t.rank].done() for t in running):
            self._wake.wait(0.05)
            self._wake.clear()
        return [t for t in running if not self.results[t.rank].done()]
