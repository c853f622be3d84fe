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

from distnb.errors import (
    CollectiveDesyncError,
    CollectiveMismatchError,
    ConfigError,
    RankError,
    SessionError,
    format_ranks,
)
from distnb.records.cell import RankFailure, RankInfo, RankSpec
from distnb.session.cells import CellResult, CellRun, Referee, assigned_names
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
    from distnb.views.timeline_model import ClockOffsets

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
        self._cells = 0

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> Session:
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
            from distnb.rank.exchange import cleanup

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
        return self._cluster is not None

    def pids(self) -> list[int]:
        """Every process this session started that is still alive."""
        return self._cluster.pids() if self._cluster is not None else []

    # --- cells ---------------------------------------------------------------------------

    def status(self) -> Status:
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
        """Run `code` on every rank (or the listed ones) and show each rank's output.

        Raises `RankError` (with each rank's traceback) if ranks raise, `RankTimeoutError` with
        a hang report past `timeout` seconds, `RankDiedError` if a rank's process exits.
        `check=False` runs the cell without the checked-collective runtime; `shapes=True` shows
        the shape table of the names the cell assigned, after it; `timeline=True` the cell's
        collective timeline.
        """
        if not self.running:
            raise SessionError(
                "no cluster is running: start one with %dist_start (or distnb.start())"
            )
        if self._broken:
            raise SessionError(self._broken)
        check_timeout(timeout)
        targets = self._targets(ranks)
        assert self._cluster is not None and self._control is not None
        cell = self._next_cell()
        run = CellRun(
            self._cluster,
            self._control,
            targets,
            cell,
            self._cells,
            check and self.options.check,
            code,
            timeout if timeout is not None else self.options.timeout,
            self.referee,
            self._on_death,
        )
        try:
            result = run.wait()
        except CollectiveMismatchError as err:
            self._explain_mismatch(err)
            raise
        except CollectiveDesyncError as err:
            self._explain_desync(err, run.run_id)
            raise
        if shapes:
            from distnb.views.display import show

            show(self.shapes(assigned_names(code)))
        if timeline:
            from distnb.views.display import show

            show(self.timeline(cells=1))
        return result

    def call(
        self,
        fn: Callable[..., Any],
        *args: Any,
        ranks: list[int] | None = None,
        timeout: float | None = 60.0,
    ) -> list[Any]:
        """Call `fn(*args)` on every rank (or the listed ones); return the results in rank order.

        For distnb's own rank-side functions (records back, no output shown); `run` is for cells.
        """
        if not self.running:
            raise SessionError("no cluster is running: start one with %dist_start")
        targets = self._targets(ranks)
        assert self._cluster is not None
        client = self._cluster.client
        pending = [client[t.engine_id].apply_async(fn, *args) for t in targets]
        results, failures = [], []
        for info, ar in zip(targets, pending, strict=False):
            try:
                results.append(ar.get(timeout=timeout))
            except Exception as exc:
                failures.append(
                    RankFailure(
                        info.rank,
                        getattr(exc, "ename", type(exc).__name__),
                        str(getattr(exc, "evalue", exc)),
                        str(getattr(exc, "traceback", "")),
                    )
                )
        if failures:
            name = getattr(fn, "__name__", "function")
            raise RankError(f"{name} failed on {format_ranks(f.rank for f in failures)}", failures)
        return results

    def shapes(self, names: list[str] | None = None, all: bool = False) -> ShapeTableView:
        """A table of each rank's tensors and modules (metadata only), differences first."""
        from distnb.rank import runtime
        from distnb.views.shapes import ShapeTableView

        return ShapeTableView.from_scans(self.call(runtime.scan, names, all))

    def overflow(self, name: str, **options: Any) -> None:
        """Trace overflow on every rank's module `name`: `distnb.overflow.watch`'s options."""
        from distnb.rank import runtime

        self.call(runtime.overflow_watch, name, options)

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

        since = None if cells is None else max(1, self._cells - cells + 1)
        events = [e for per_rank in self.call(runtime.events, since) for e in per_rank]
        return TimelineView(events, self._clock_offsets())

    def _clock_offsets(self) -> ClockOffsets | None:
        """Per-rank offsets onto the kernel's clock: none on one host (one monotonic clock)."""
        from distnb.session.clocks import estimate_offsets

        if len({r.host for r in self.ranks}) <= 1:
            return None
        return estimate_offsets(self.call, [r.rank for r in self.ranks])

    def _explain_desync(self, err: CollectiveDesyncError, run_id: int) -> None:
        """Now that every rank is idle, their recorded calls can say which one was skipped."""
        from distnb.rank import runtime

        events = [e for per_rank in self.call(runtime.events, run_id) for e in per_rank]
        waiting = self.referee.waiters.pop(run_id, [])
        skipped = skipped_call([e for e in events if e.cell == run_id], waiting)
        if skipped:
            err.message += f"\n{skipped}"
            err.args = (err.message,)

    def _explain_mismatch(self, err: CollectiveMismatchError) -> None:
        """Fetch the record from a rank that raised it; in Jupyter, show it as a table."""
        from distnb.rank import runtime
        from distnb.views.display import in_kernel
        from distnb.views.mismatch import MismatchView

        (err.mismatch,) = self.call(runtime.last_mismatch, ranks=[err.failures[0].rank])
        if err.mismatch is not None and in_kernel():
            from IPython.display import display

            display(MismatchView(err.mismatch))  # type: ignore[no-untyped-call]

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

    def _next_cell(self) -> int:
        from IPython import get_ipython

        shell = get_ipython()
        self._cells += 1
        if shell is None:
            return self._cells
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
