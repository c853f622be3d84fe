"""The session: a cluster of ranks, the control plane, and cells run on them.

with distnb.start(n=2) as s:          # %dist_start -n 2
    s.run("print(rank)")              # %%allranks
    s.status()                        # %dist_status
                                      # %dist_stop on leaving the block

What a session does besides its lifecycle and runs lives in method modules beside this one
(`status`, `data`, `inspection`, `replicas`, `automode`), bound here as methods.
"""

from __future__ import annotations

import atexit
import contextlib
import signal
import sys
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from distnb import interrupts
from distnb.errors import CallInterrupted, ConfigError, RankError, SessionError
from distnb.ranklist import RankArg, format_ranks, rank_arg
from distnb.records.cell import RankFailure, RankInfo
from distnb.session import automode, data, inspection, profiling, replicas, status
from distnb.session.cluster import Cluster
from distnb.session.cluster.deaths import death_reason
from distnb.session.cluster.launch import Ended, port_taken
from distnb.session.cluster.teardown import TeardownReport, teardown_report
from distnb.session.control import ControlPlane, boards_pattern
from distnb.session.joining import join
from distnb.session.options import Options, check_timeout
from distnb.session.runs import failures as failing
from distnb.session.runs.referee import DesyncReferee
from distnb.session.runs.request import CellRequest, CellResult, assigned_names, notebook_cell
from distnb.session.runs.run import CellRun
from distnb.views.status import Progress, Status

_live: weakref.WeakSet[Session] = weakref.WeakSet()
_CALL_SLICE_S = 0.05  # `call` looks for Ctrl-C this often
_CALL_GRACE_S = 2.0  # how long ranks interrupted in a `call` get to end it


class Session:
    """Ranks on an ipyparallel cluster with `torch.distributed` initialised on each.

    Create one with `distnb.start()`. Every magic is a thin shell over a method here.
    """

    def __init__(self, options: Options) -> None:
        self.options = options
        self.ranks: tuple[RankInfo, ...] = ()
        self.referee: DesyncReferee | None = None
        self._cluster: Cluster | None = None
        self._control: ControlPlane | None = None
        self._broken = ""
        self._runs = 0  # runs so far: the last one's run id
        self.pdb = False  # open the debugger on the first failing rank when a run fails
        self._failed: RankError | None = None  # the last run's error, while ranks keep it
        self.last_teardown: TeardownReport | None = None  # what the last `restart` stopped

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> Session:
        """Launch the engines, make them ranks and return this session, ready for `run`.

        Raises `SessionError` (nothing left running) if the cluster cannot start, `ConfigError`
        for options that cannot work here (e.g. `backend="nccl"` without a GPU per rank).
        """
        if self._cluster is not None:
            raise SessionError("this session is already running; stop() or restart() it first")
        progress = Progress(self.options.n, enabled=self.options.progress)
        for attempt in range(2):
            try:
                self._launch(progress)
                break
            except BaseException as exc:
                with interrupts.held():  # a second Ctrl-C waits for the teardown
                    self._teardown()
                if attempt == 0 and port_taken(exc):
                    continue  # another process took a port ipyparallel had picked: pick again
                progress.close()
                if isinstance(exc, (ConfigError, KeyboardInterrupt)):
                    raise
                raise SessionError(
                    f"the cluster did not start: {exc}\nNothing is left running; fix the cause "
                    "and run %dist_start again (distnb doctor checks the set-up)."
                ) from exc
        progress.close()
        self._broken = ""
        _live.add(self)
        return self

    def _launch(self, progress: Progress) -> None:
        opts = self.options
        progress.show("starting engines", 0)
        self._cluster = Cluster(opts.n, opts.engines, opts.host)
        self._cluster.launch()
        # The kernel imports torch for the control plane while the engines boot.
        self._control = ControlPlane(opts.host)
        self._cluster.remove_later(boards_pattern(self._control.session_id))
        client = self._cluster.wait_registered(progress.show, opts.register_timeout)
        self.ranks = join(self._cluster, self._control, client, opts, progress.show)
        status.prepare(self)  # OOM counts; outside Jupyter, text widgets on ranks
        self.referee = DesyncReferee(self._control)

    def stop(self) -> TeardownReport:
        """Stop every rank, the controller and the control plane; leave no process behind.

        Returns what was stopped, host by host, and the ranks on hosts that did not answer
        (which end by themselves); such a host is also named in a `DistnbWarning`."""
        ranks = self.ranks
        with interrupts.held() as noted:
            ended = self._teardown()
        self.ranks, self._broken = (), ""  # a new cluster starts whole (start may run cells)
        _live.discard(self)
        if ended is None:
            return teardown_report((), (), 0)
        report = teardown_report(ranks, ended.silent, ended.processes, ended.left)
        return replace(report, interrupted=noted.count > 0)

    def _teardown(self) -> Ended | None:
        """End what runs; Ctrl-C waits until it has (a teardown cut half-way leaves processes
        running): callers hold interrupts around it."""
        ended = None
        if self._cluster is not None:
            ended = self._cluster.stop()
            self._cluster = None
        if self._control is not None:
            from distnb.rank.checked.exchange import cleanup

            cleanup(self._control.session_id)  # shared-memory boards of crashed ranks
            self._control.close()
            self._control = None
        return ended

    def restart(self) -> Session:
        """Stop, then start again with the same options (the fix after a rank died or hung);
        what the stop did is on `last_teardown`."""
        self.last_teardown = self.stop()
        return self.start()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """True from `start()` until `stop()`, even while a dead rank waits for `restart()`."""
        return self._cluster is not None

    def pids(self) -> list[int]:
        """Every process this session started that is still alive."""
        return self._cluster.pids() if self._cluster is not None else []

    @property
    def cluster(self) -> Cluster | None:
        """The ranks' processes and ipyparallel's client (None when not running)."""
        return self._cluster

    @property
    def control(self) -> ControlPlane | None:
        """The control plane the ranks join (None when not running)."""
        return self._control

    @property
    def broken(self) -> str:
        """Why the cluster cannot run cells (a process it needs died), or ""."""
        return self._broken

    # --- cells ---------------------------------------------------------------------------

    def status(self) -> Status:
        """One row per rank (rank, host, pid, device, backend, memory, torch's intra-op threads,
        CUDA memory, state), each rank's distributed environment, and what is wrong if anything.

        >>> s.status()
        rank  host  pid    device  backend  memory (peak)          intra-op threads  state
        0     vm    13901  cpu     gloo     402.1 MiB (402.3 MiB)  1                 alive
        """
        if not self.running:
            return Status((), status.NO_CLUSTER)
        self._notice_death()
        return status.status(self)

    # what else a session does, in modules of their own
    pull = data.pull
    push = data.push
    auto = automode.auto
    shapes = inspection.shapes
    overflow = inspection.overflow
    overflow_detach = inspection.overflow_detach
    overflow_report = inspection.overflow_report
    timeline = inspection.timeline
    profile = profiling.profile
    profile_report = profiling.profile_report
    diff = replicas.diff
    diff_watch = replicas.diff_watch
    diff_report = replicas.diff_report
    diff_stop = replicas.diff_stop

    def run(
        self,
        code: str,
        ranks: RankArg | None = None,
        timeout: float | None = None,
        check: bool = True,
        shapes: bool = False,
        timeline: bool = False,
        profile: bool = False,
    ) -> CellResult:
        """Run `code` on every rank (or the listed ones: `[0, 2]`, or `"0-3,6"` as `--ranks`
        reads it); return each rank's output.

        >>> r = s.run("x = torch.ones(2) * rank\ndist.all_reduce(x)\nx.sum().item()")
        [rank 0] ...
        >>> r.result(1)
        '2.0'

        While it runs, each rank's output is shown as it comes (labelled, in rank order).
        Raises `RankError` (each rank's traceback on `err.failures`) if ranks raise; the checked
        runtime's `CollectiveMismatchError` (with `err.mismatch`) and `CollectiveDesyncError`;
        `RankTimeoutError` with a hang report past `timeout` seconds; `RankDiedError` if a rank's
        process exits. `check=False` runs the cell without the checked-collective runtime;
        `shapes=True` puts the shape table of the names the cell assigned on `result.views`,
        `timeline=True` the cell's collective timeline, `profile=True` its profile on every rank
        (`distnb.session.profiling`: steps by phase, the straggler and its cause).
        """
        self.require_running()
        check_timeout(timeout)
        targets = self.targets(ranks)
        self._runs += 1
        request = CellRequest(
            cell=notebook_cell(self._runs),
            run_id=self._runs,
            code=code,
            targets=tuple(targets),
            check=check and self.options.check,
            timeout=timeout if timeout is not None else self.options.timeout,
            everyone=len(targets) == len(self.ranks),
        )
        if profile:
            self.profile(ranks=ranks)
        try:
            result = self._execute(request)
        except BaseException:
            if profile:
                profiling.profile_discard(self)
            raise
        views: list[Any] = []
        if shapes:
            views.append(self.shapes(assigned_names(code)))
        if timeline:
            views.append(self.timeline(cells=1))
        if profile:
            views.append(self.profile_report())
        return replace(result, views=tuple(views))

    def run_script(
        self,
        path: str,
        args: str | Sequence[str] = (),
        timeout: float | None = None,
        check: bool = True,
    ) -> CellResult:
        """Run the file at `path` as `__main__` on every rank, with `sys.argv = [path, *args]`,
        as under `torchrun --nproc-per-node N`; output, checks, `timeout`, Ctrl-C and errors are
        those of `run`, messages name the script (see `distnb.session.runs.scripts`).

        >>> s.run_script("train.py", "--lr 0.1")   # %dist_run train.py --lr 0.1
        """
        from distnb.session.runs.scripts import script_request

        self.require_running()
        check_timeout(timeout)
        timeout = timeout if timeout is not None else self.options.timeout
        request = script_request(
            path,
            args,
            notebook_cell(self._runs),
            self._runs + 1,
            tuple(self.ranks),
            check and self.options.check,
            timeout,
        )
        self._runs += 1
        return self._execute(request)

    def _execute(self, request: CellRequest) -> CellResult:
        """Run a cell or a script; its ranks' failures raised as one error."""
        __tracebackhide__ = True  # IPython leaves this frame out of tracebacks
        self._failed = None
        result = self._run(request)
        if result.failures:
            waiting = self.referee.waiters.pop(result.run_id, []) if self.referee else []
            posted = self.control.mismatch if self.control else lambda run_id: None
            error = failing.run_error(request.where, result, self.call, waiting, posted)
            self._failed = error
            if self.pdb and failing.debuggable(error.failures):
                print(f"distnb: {error.message.splitlines()[0]}", flush=True)
                self.debug()
            raise error
        return result

    def debug(self, rank: int | None = None) -> None:
        """Open the debugger at the failing frame of `rank` (default: the first rank that failed)
        in the last run, with that frame's locals (`%dist_debug [RANK]`); `session.pdb = True`
        (`%dist_pdb on`) does it on every failure. A rank keeps its traceback until its next cell.
        """
        from distnb.session.debugger.postmortem import post_mortem_request

        self.require_running(notice=True)
        request = post_mortem_request(self._failed, rank, self.ranks, notebook_cell(self._runs))
        self._runs += 1
        result = self._run(replace(request, run_id=self._runs))
        if result.failures:
            raise failing.cell_error(request.where, result.failures)

    def _run(self, request: CellRequest) -> CellResult:
        """Send a run to its ranks and wait for it (output, prompts, timeouts, Ctrl-C)."""
        __tracebackhide__ = True  # IPython leaves this frame out of tracebacks
        assert self._cluster is not None and self._control is not None
        run = CellRun(self._cluster, self._control, request, self.referee, self._on_death)
        try:
            return run.start().wait()
        finally:
            self._cluster.forget(run.results.values())

    def debugs(self, error: BaseException | None) -> bool:
        """Whether `debug()` can open `error`'s ranks (it is the last run's, and it failed)."""
        return error is not None and error is self._failed and self.running

    def call(
        self,
        fn: Callable[..., Any],
        *args: Any,
        ranks: RankArg | None = None,
        timeout: float | None = 60.0,
    ) -> list[Any]:
        """Call `fn(*args)` on every rank (or the listed ones); return the results in rank order.

        For distnb's own rank-side functions (records back, no output shown); `run` is for cells.

        >>> s.call(os.getpid)
        [13901, 13903]
        """
        self.require_running(notice=True)
        targets = self.targets(ranks)
        cluster = self._cluster
        assert cluster is not None
        pending = [cluster.view(t.engine_id).apply_async(fn, *args) for t in targets]
        results: list[Any] = []
        failures: list[RankFailure] = []
        # Ctrl-C is taken between waits, never inside ipyparallel's locks (`interrupts`)
        with interrupts.held() as noted:
            for info, ar in zip(targets, pending, strict=True):
                deadline = None if timeout is None else time.monotonic() + timeout
                while not ar.ready() and not noted.count:
                    if deadline is not None and time.monotonic() >= deadline:
                        break
                    ar.wait(_CALL_SLICE_S)
                if noted.count:
                    raise self._call_interrupted(fn, targets, pending)
                try:
                    results.append(ar.get(timeout=0))
                except Exception as exc:
                    failures.append(failing.to_failure(info.rank, exc))
        cluster.forget(pending)
        if failures:
            raise failing.call_error(getattr(fn, "__name__", "function"), failures)
        return results

    def _call_interrupted(
        self, fn: Callable[..., Any], targets: list[RankInfo], pending: list[Any]
    ) -> CallInterrupted:
        """Ctrl-C during `call`: the ranks still in it are interrupted (distnb's own calls take
        milliseconds: one still running is stuck), and the error says where it had finished."""
        assert self._cluster is not None
        running = [t for t, ar in zip(targets, pending, strict=True) if not ar.ready()]
        self._cluster.signal(signal.SIGINT, [t.engine_id for t in running])
        deadline = time.monotonic() + _CALL_GRACE_S
        while time.monotonic() < deadline and not all(ar.ready() for ar in pending):
            time.sleep(_CALL_SLICE_S)
        self._cluster.forget(pending)
        done = [t.rank for t in targets if t not in running]
        cut = [t.rank for t in running]
        if not cut:
            said = "every rank had answered when Ctrl-C came"
        else:
            which = "which had" if len(cut) == 1 else "which had each"
            after = f" ({format_ranks(done)} had)" if done else ""
            said = f"distnb interrupted {format_ranks(cut)}, {which} not answered{after}"
        return CallInterrupted(f"{said}; the cluster is usable", done, cut)

    def targets(self, ranks: RankArg | None) -> list[RankInfo]:
        """The listed ranks' records, in rank order (every rank's for None or `"all"`); a
        string reads as `--ranks` does (`"0-3,6"`, `"ranks 0-1"`). `ConfigError` naming the
        ranks this session has, for a rank it does not."""
        try:
            ranks = rank_arg(ranks)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if ranks is None:
            return list(self.ranks)
        world = len(self.ranks)
        bad = [r for r in ranks if not 0 <= r < world]
        if bad or not ranks:
            raise ConfigError(
                f"ranks {bad or ranks} are not in this session, which has "
                f"{format_ranks(range(world))}; e.g. --ranks 0-{world - 1}"
            )
        return [self.ranks[r] for r in sorted(set(ranks))]

    @property
    def runs(self) -> int:
        """How many runs (cells, scripts) this session has made: the last one's run id."""
        return self._runs

    def require_running(self, notice: bool = False) -> None:
        """`SessionError` unless cells can run: no cluster, or a process it needs died.
        `notice`: look for processes that died since the last cell first (a cell does that
        itself, and names a dead rank as such)."""
        if not self.running:
            raise SessionError(
                "no cluster is running: start one with %dist_start (or distnb.start())"
            )
        if notice:
            self._notice_death()
        if self._broken:
            raise SessionError(self._broken)

    def _notice_death(self) -> None:
        """A process of the cluster that died since we last looked breaks the session."""
        cluster = self._cluster
        gone = cluster.members.dead() if cluster is not None and not self._broken else None
        if gone is not None and cluster is not None:
            self._on_death(death_reason(gone, cluster.members.how_died(gone.pid), self.ranks))

    def _on_death(self, reason: str) -> None:
        """A process of the cluster died: `reason` says which, what it means and what to run."""
        self._broken = reason


@atexit.register
def _stop_all() -> None:
    """Stop every running session as Python exits, and say so in distnb's words (ipyparallel's
    exit handler, `Stopping cluster <Cluster(...)>`, is off for distnb's clusters). The line goes
    to the process's stdout: the terminal in IPython; a kernel's stream may be closed by now."""
    for session in list(_live):
        ranks, processes = len(session.ranks), len(session.pids())
        session.stop()
        with contextlib.suppress(OSError, ValueError):
            print(
                f"distnb: stopped {ranks} ranks and the controller ({processes} processes) at exit",
                file=sys.__stdout__,
                flush=True,
            )
