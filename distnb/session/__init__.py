"""A session: a cluster of ranks, the control plane, and cells run on them.

with distnb.start(n=2) as s:          # %dist_start -n 2
    s.run("print(rank)")              # %%allranks
    s.status()                        # %dist_status
                                      # %dist_stop on leaving the block
"""

from __future__ import annotations

import atexit
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from distnb.errors import ConfigError, RankError, SessionError
from distnb.ranklist import format_ranks
from distnb.records.cell import RankFailure, RankInfo, RankSpec
from distnb.records.collective import Mismatch
from distnb.session import failures as failing
from distnb.session.cells import CellRequest, CellResult, CellRun, Referee, assigned_names
from distnb.session.cluster import Cluster
from distnb.session.control import ControlPlane
from distnb.session.options import Options, check_timeout, engine_env
from distnb.session.ranks import assign_ranks, choose_backend
from distnb.session.referee import DesyncReferee, skipped_call
from distnb.views.status import Progress, Status

if TYPE_CHECKING:
    from distnb.views.overflow import OverflowView
    from distnb.views.shapes import ShapeTableView
    from distnb.views.timeline import TimelineView
    from distnb.views.timeline.model import ClockOffsets

_live: weakref.WeakSet[Session] = weakref.WeakSet()


class Session:
    """Ranks on an ipyparallel cluster with `torch.distributed` initialised on each.

    Create one with `distnb.start()`. Every magic is a thin shell over a method here.
    """

    def __init__(self, options: Options) -> None:
        self.options = options.validated()
        self.ranks: tuple[RankInfo, ...] = ()
        self.referee: Referee = Referee()
        self._cluster: Cluster | None = None
        self._control: ControlPlane | None = None
        self._broken = ""
        self._runs = 0  # runs so far: the last one's run id

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> Session:
        """Launch the engines, make them ranks and return this session, ready for `run`.

        Raises `SessionError` (nothing left running) if the cluster cannot start, `ConfigError`
        for options that cannot work here (e.g. `backend="nccl"` without a GPU per rank).
        """
        if self._cluster is not None:
            raise SessionError("this session is already running; stop() or restart() it first")
        opts = self.options
        assert opts.n is not None
        progress = Progress(opts.n, enabled=opts.progress)
        try:
            progress.show("starting engines", 0)
            self._cluster = Cluster(opts.n, opts.engines, opts.host, engine_env(opts.n))
            self._cluster.launch()
            # The kernel imports torch for the control plane while the engines boot.
            self._control = ControlPlane(opts.host)
            client = self._cluster.wait_registered(lambda k: progress.show("engines registered", k))
            self.ranks = self._init_ranks(client, progress)
            self.referee = DesyncReferee(self._control)
        except BaseException as exc:
            progress.close()
            self._teardown()
            if isinstance(exc, (ConfigError, KeyboardInterrupt)):
                raise
            raise SessionError(
                f"the cluster did not start: {exc}\nNothing is left running; fix the cause and "
                "run %dist_start again (distnb doctor checks the set-up)."
            ) from exc
        progress.close()
        self._broken = ""
        _live.add(self)
        return self

    def _init_ranks(self, client: Any, progress: Progress) -> tuple[RankInfo, ...]:
        from distnb.rank import runtime

        opts = self.options
        assert self._control is not None and opts.n is not None
        probes = [client[eid].apply_async(runtime.probe, eid) for eid in client.ids]
        placements = assign_ranks([ar.get(timeout=60) for ar in probes])
        backend = choose_backend(opts.backend, placements)
        pending = []
        for p in placements:
            spec = RankSpec(
                rank=p.rank,
                world_size=len(placements),
                local_rank=p.local_rank,
                local_world_size=p.local_world_size,
                backend=backend,
                store_host=opts.host,
                store_port=self._control.port,
                session_id=self._control.session_id,
                check=opts.check,
            )
            pending.append((p, client[p.probe.engine_id].apply_async(runtime.init, spec)))
        ranks = []
        for i, (p, ar) in enumerate(pending):
            info = ar.get(timeout=120)
            ranks.append(replace(info, engine_id=p.probe.engine_id))
            progress.show("ranks joined the process group", i + 1)
        return tuple(ranks)

    def stop(self) -> None:
        """Stop every rank, the controller and the control plane; leave no process behind."""
        self._teardown()
        self.ranks = ()
        _live.discard(self)

    def _teardown(self) -> None:
        if self._cluster is not None:
            self._cluster.stop()
            self._cluster = None
        if self._control is not None:
            from distnb.rank.checked.exchange import cleanup

            cleanup(self._control.session_id)  # shared-memory boards of crashed ranks
            self._control.close()
            self._control = None

    def restart(self) -> Session:
        """Stop, then start again with the same options (the fix after a rank died or hung)."""
        self.stop()
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

    # --- cells ---------------------------------------------------------------------------

    def status(self) -> Status:
        """One row per rank (rank, host, pid, device, backend), and what is wrong if anything.

        >>> s.status()
        rank  host  pid    device  backend
        0     vm    13901  cpu     gloo
        1     vm    13903  cpu     gloo
        """
        if not self.running:
            return Status((), "distnb: no cluster running; start one with %dist_start")
        return Status(self.ranks, self._broken)

    def run(
        self,
        code: str,
        ranks: list[int] | None = None,
        timeout: float | None = None,
        check: bool = True,
        shapes: bool = False,
        timeline: bool = False,
    ) -> CellResult:
        """Run `code` on every rank (or the listed ones); return each rank's output.

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
        `timeline=True` the cell's collective timeline.
        """
        self._require_running()
        check_timeout(timeout)
        targets = self._targets(ranks)
        assert self._cluster is not None and self._control is not None
        self._runs += 1
        request = CellRequest(
            cell=self._cell_number(),
            run_id=self._runs,
            code=code,
            targets=tuple(targets),
            check=check and self.options.check,
            timeout=timeout if timeout is not None else self.options.timeout,
        )
        result = (
            CellRun(self._cluster, self._control, request, self.referee, self._on_death)
            .start()
            .wait()
        )
        if result.failures:
            raise self._cell_error(request.where, result)
        views: list[Any] = []
        if shapes:
            views.append(self.shapes(assigned_names(code)))
        if timeline:
            views.append(self.timeline(cells=1))
        return replace(result, views=tuple(views))

    def _cell_error(self, where: str, result: CellResult) -> RankError:
        """The run's one exception, with what can only be learnt now that every rank is idle:
        the mismatch record, or which call a rank skipped."""
        mismatch: Mismatch | None = None
        skipped = ""
        if failing.only_checked(result.failures):
            kinds = {f.ename for f in result.failures}
            if "CollectiveMismatchError" in kinds:
                rank = min(f.rank for f in result.failures if f.ename == "CollectiveMismatchError")
                mismatch = self._last_mismatch(rank)
            else:
                skipped = self._skipped_call(result.run_id)
        return failing.cell_error(where, result.failures, mismatch, skipped)

    def _skipped_call(self, run_id: int) -> str:
        from distnb.rank import runtime

        events = [e for per_rank in self.call(runtime.events, run_id) for e in per_rank]
        waiting = self.referee.waiters.pop(run_id, [])
        return skipped_call([e for e in events if e.run_id == run_id], waiting)

    def _last_mismatch(self, rank: int) -> Mismatch | None:
        from distnb.rank import runtime

        (mismatch,) = self.call(runtime.last_mismatch, ranks=[rank])
        return mismatch  # type: ignore[no-any-return]

    def call(
        self,
        fn: Callable[..., Any],
        *args: Any,
        ranks: list[int] | None = None,
        timeout: float | None = 60.0,
    ) -> list[Any]:
        """Call `fn(*args)` on every rank (or the listed ones); return the results in rank order.

        For distnb's own rank-side functions (records back, no output shown); `run` is for cells.

        >>> s.call(os.getpid)
        [13901, 13903]
        """
        self._require_running()
        targets = self._targets(ranks)
        assert self._cluster is not None
        pending = [self._cluster.view(t.engine_id).apply_async(fn, *args) for t in targets]
        results: list[Any] = []
        failures: list[RankFailure] = []
        for info, ar in zip(targets, pending, strict=True):
            try:
                results.append(ar.get(timeout=timeout))
            except Exception as exc:
                failures.append(failing.to_failure(info.rank, exc))
        if failures:
            raise failing.call_error(getattr(fn, "__name__", "function"), failures)
        return results

    def shapes(self, names: list[str] | None = None, all: bool = False) -> ShapeTableView:
        """A table of each rank's tensors and modules (metadata only), differences first."""
        from distnb.rank import runtime
        from distnb.views.shapes import ShapeTableView

        return ShapeTableView.from_scans(self.call(runtime.scan, names, all))

    def overflow(self, name: str, **options: Any) -> None:
        """Trace overflow on every rank's module `name`: `distnb.overflow.watch`'s options.

        The options are checked here, before any rank is asked (`ConfigError`).

        Example::

            session.overflow("model", stats="auto", stop_on_nonfinite=True)
        """
        from distnb.rank import runtime
        from distnb.records.overflow import WatchOptions

        record = WatchOptions.of(**options)
        self.call(runtime.overflow_watch, name, record.to_dict())

    def overflow_detach(self, name: str) -> None:
        """Remove every hook of the tracer on `name`: ranks run at full speed again."""
        from distnb.rank import runtime

        if not any(self.call(runtime.overflow_detach, name)):
            raise ConfigError(f"no overflow trace named {name!r}; start one with %dist_overflow")

    def overflow_report(self) -> dict[str, OverflowView]:
        """Each traced module's frames per rank, and which rank went non-finite first."""
        from distnb.rank import runtime
        from distnb.views.overflow import OverflowView

        per_rank = self.call(runtime.overflow_reports)
        names = sorted({name for reports in per_rank for name in reports})
        return {n: OverflowView([r[n] for r in per_rank if n in r]) for n in names}

    def timeline(self, cells: int | None = None) -> TimelineView:
        """Every recorded collective of the last `cells` cells (all kept, by default), per rank."""
        from distnb.rank import runtime
        from distnb.views.timeline import TimelineView

        since = None if cells is None else max(1, self._runs - cells + 1)
        events = [e for per_rank in self.call(runtime.events, since) for e in per_rank]
        return TimelineView(events, self._clock_offsets())

    def _clock_offsets(self) -> ClockOffsets | None:
        """Per-rank offsets onto the kernel's clock: none on one host (one monotonic clock)."""
        from distnb.session.clocks import estimate_offsets

        if len({r.host for r in self.ranks}) <= 1:
            return None
        return estimate_offsets(self.call, [r.rank for r in self.ranks])

    def _targets(self, ranks: list[int] | None) -> list[RankInfo]:
        if ranks is None:
            return list(self.ranks)
        world = len(self.ranks)
        bad = [r for r in ranks if not 0 <= r < world]
        if bad or not ranks:
            raise ConfigError(
                f"ranks {bad or ranks} are not in this session, which has "
                f"{format_ranks(range(world))}; e.g. --ranks 0,{world - 1}"
            )
        return [self.ranks[r] for r in sorted(set(ranks))]

    def _require_running(self) -> None:
        if not self.running:
            raise SessionError(
                "no cluster is running: start one with %dist_start (or distnb.start())"
            )
        if self._broken:
            raise SessionError(self._broken)

    def _cell_number(self) -> int:
        """The notebook's number for the running cell (the run id outside IPython)."""
        from IPython import get_ipython

        shell = get_ipython()
        if shell is None:
            return self._runs
        # While a cell runs, IPython has already counted on to the next number; the running
        # cell's own number is on its result.
        running = getattr(shell.displayhook, "exec_result", None)
        return int(running.execution_count if running is not None else shell.execution_count)

    def _on_death(self, info: RankInfo, how: str) -> None:
        self._broken = (
            f"rank {info.rank} {how}; the process group lost a member. "
            "Run %dist_restart (or session.restart())."
        )


def start(
    n: int | None = None,
    *,
    backend: str = "auto",
    timeout: float | None = None,
    engines: str = "local",
    host: str = "127.0.0.1",
    check: bool = True,
    progress: bool = True,
) -> Session:
    """Start `n` ranks (default: one per local GPU, else 2) and return the running session.

    >>> with distnb.start(n=2) as s:
    ...     s.run("print(rank, world_size)")
    [rank 0] 0 2
    [rank 1] 1 2
    """
    options = Options(n, backend, timeout, engines, host, check, progress)
    return Session(options).start()


@atexit.register
def _stop_all() -> None:
    for session in list(_live):
        session.stop()
