"""distnb's magics: argument parsing and display only; each calls one `Session` method.

The tools that look into ranks (`%dist_status`, `%dist_shapes`, `%dist_diff`, `%dist_overflow`,
`%dist_pull`, `%dist_push`, `%dist_timeline`) act on the current target (`DistMagics.target`):
the job `%dist_attach` attached while one is, else the session's ranks."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, cast

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from distnb.errors import ConfigError, SessionError
from distnb.magics.args import (
    numbers,
    parse,
    rank_list,
    seconds,
    size,
    whole,
)
from distnb.magics.attach import profiling_steps
from distnb.records.profiling import MOST_STEPS
from distnb.session import Session, start
from distnb.session.automode import AutoMode
from distnb.session.options import REGISTER_TIMEOUT_S
from distnb.session.status import NO_CLUSTER
from distnb.views.display import show, shown
from distnb.views.status import Status

if TYPE_CHECKING:
    from distnb.magics.attach import AttachMagics
    from distnb.session.target import Target


@magics_class
class DistMagics(Magics):
    """`%dist_start`, `%%allranks`, `%dist_status`, `%dist_restart`, `%dist_stop`."""

    def __init__(self, shell: Any, attach: AttachMagics | None = None) -> None:
        super().__init__(shell)
        self.session: Session | None = None
        self.pdb = False  # %dist_pdb: kept here so that it holds for sessions started later
        self.attach = attach  # holds the attached job, if any
        self._told: object = None  # the job the user was told the tools act on

    @magic_arguments()
    @argument("-n", type=str, default=None, help="number of ranks (default: one per GPU, else 2)")
    @argument("--backend", default="auto", help="auto (NCCL if every rank has a GPU), gloo, nccl")
    @argument("--timeout", type=str, default=None, help="default timeout of each cell, seconds")
    @argument("--engines", default="local", help="ipyparallel launcher: local, mpi, slurm, ssh...")
    @argument("--host", default="127.0.0.1", help="address the control plane listens on")
    @argument("--no-check", action="store_true", help="turn off the checked-collective runtime")
    @argument("--register-timeout", type=str, default=None, help="seconds engines get to register")
    @argument("--hosts", default=None, help="ranks over ssh, per host: node1:4,node2:4")
    @argument("--python", default="", help="the Python on those hosts (default: this one's path)")
    @argument("--slurm", default="", help="--engines slurm: sbatch's (srun's) options, quoted")
    @line_magic
    def dist_start(self, line: str) -> Any:
        """Start ranks: `%dist_start -n 2 [--backend gloo] [--timeout 60]`."""
        args = parse(self.dist_start, line)
        if self.session is not None and self.session.running:
            raise UsageError(
                "a distnb cluster is already running: use it, or %dist_restart / %dist_stop first"
            )
        try:
            self.session = start(
                whole(args.n, "-n") if args.n is not None else None,
                backend=args.backend,
                timeout=seconds(args.timeout),
                engines=args.engines,
                host=args.host,
                check=not args.no_check,
                register_timeout=seconds(args.register_timeout, "--register-timeout")
                or REGISTER_TIMEOUT_S,
                **{name: getattr(args, name) for name in ("hosts", "python", "slurm")},
            )
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        except KeyboardInterrupt:  # the start tore down what it had begun (Session.start)
            raise UsageError(
                "%dist_start was interrupted: nothing is left running; %dist_start starts again"
            ) from None
        self.session.pdb = self.pdb
        return self.session.status()

    @line_magic
    def dist_status(self, line: str) -> Any:
        """Show each rank: host, pid, device, backend (an attached job's: state, collective,
        step, the verdicts and the live stacks)."""
        job = self._job()
        if job is not None:
            return self.target().status()
        if self.session is None:
            return Status((), NO_CLUSTER)
        return self.session.status()

    @line_magic
    def dist_stop(self, line: str) -> None:
        """Stop the ranks and the controller; say what was stopped and what was not reached."""
        if self.session is None or not self.session.running:
            print("distnb: no cluster was running")
            return
        report = self.session.stop()
        print("\n".join(f"distnb: {line}" for line in str(report).splitlines()))

    @magic_arguments()
    @argument("rank", nargs="?", type=str, default=None, help="the rank (default: first failed)")
    @line_magic
    def dist_debug(self, line: str) -> None:
        """Post-mortem: `%dist_debug [RANK]` opens the debugger where the last cell failed on
        RANK (default: the first rank that failed), with that frame's locals."""
        rank = parse(self.dist_debug, line).rank
        if rank is not None and not rank.isdigit():
            raise UsageError(f"RANK is a rank's number, not {rank!r}: e.g. %dist_debug 1")
        try:
            self._running().debug(int(rank) if rank is not None else None)
        except (ConfigError, SessionError) as exc:
            raise UsageError(str(exc)) from None

    @magic_arguments()
    @argument("state", nargs="?", choices=["on", "off"], help="on or off (default: switch)")
    @line_magic
    def dist_pdb(self, line: str) -> None:
        """`%dist_pdb on|off`: open the debugger on the first failing rank whenever an
        %%allranks cell or %dist_run fails, as IPython's %pdb does for the kernel."""
        args = parse(self.dist_pdb, line)
        self.pdb = args.state == "on" if args.state else not self.pdb
        if self.session is not None:
            self.session.pdb = self.pdb
        print(f"distnb: automatic post-mortem on ranks is {'on' if self.pdb else 'off'}")

    @line_magic
    def dist_restart(self, line: str) -> Any:
        """Stop, then start again with the same arguments."""
        if self.session is None:
            raise UsageError("nothing to restart: start a cluster with %dist_start")
        try:
            session = self.session.restart()
        except KeyboardInterrupt:  # the stop finished; the start tore down what it had begun
            raise UsageError(
                "%dist_restart was interrupted while the new cluster started: the old one was "
                "stopped and nothing is left running; %dist_start starts again"
            ) from None
        if session.last_teardown is not None and session.last_teardown.not_reached:
            print("\n".join(f"distnb: {line}" for line in str(session.last_teardown).splitlines()))
        return session.status()

    @magic_arguments()
    @argument("--ranks", type=str, default=None, help="these ranks only, e.g. 0-3,6 (or 0,2, all)")
    @argument("--timeout", type=str, default=None, help="seconds before a hang report")
    @argument("--unchecked", action="store_true", help="run without collective checks")
    @argument("--shapes", action="store_true", help="then show the shapes of what it assigned")
    @argument("--timeline", action="store_true", help="then show the cell's collective timeline")
    @argument("--profile", action="store_true", help="profile it on every rank: who is slow, why")
    @cell_magic
    def allranks(self, line: str, cell: str) -> None:
        """Run the cell on every rank: `%%allranks [--ranks 0-1] [--timeout 30]`."""
        args = parse(self.allranks, line)
        session = self._running()
        ranks = rank_list(args.ranks)
        shown(
            lambda: session.run(
                # Line 1 of the notebook cell is the magic: keep line numbers the same on ranks.
                "# %%allranks\n" + cell,
                ranks=ranks,
                timeout=seconds(args.timeout),
                check=not args.unchecked,
                shapes=args.shapes,
                timeline=args.timeline,
                profile=args.profile,
            )
        )

    @magic_arguments()
    @argument("names", nargs="+", help="modules, tensors, optimizers, dicts/lists of them")
    @argument("--grads", action="store_true", help="modules' gradients too")
    @argument("--buffers", action="store_true", help="modules' buffers too")
    @argument("--atol", type=float, default=0.0, help="differences up to this count as agreement")
    @argument("--expect", default="same", help="same (replicas), or differ (each rank's data)")
    @argument("--watch", action="store_true", help="record a module's digests as it trains")
    @argument("--every", type=int, default=1, help="--watch every N-th step")
    @argument("--optim", default=None, help="--watch this optimizer too; its steps count")
    @argument("--raise", dest="raise_", action="store_true", help="--watch: raise when they differ")
    @argument("--report", action="store_true", help="the first step the watched replicas differed")
    @argument("--stop", action="store_true", help="remove the watch")
    @argument("--ranks", type=str, default=None, help="these ranks only, e.g. 0-3,6")
    @line_magic
    def dist_diff(self, line: str) -> None:
        """Do replicas agree? `%dist_diff model opt [--grads] [--buffers] [--atol X]`: each
        tensor compared, bit for bit, across the ranks that should hold it identically.
        `%dist_diff model --watch [--every N] [--optim opt] [--raise]`, `--report`, `--stop`."""
        args = parse(self.dist_diff, line)
        target, name, ranks = self.target(), args.names[0], rank_list(args.ranks)
        options = {"grads": args.grads, "buffers": args.buffers, "atol": args.atol}
        try:
            if target is not self.session:
                self._on_ranks_only(args, "watch", "report", "stop")
                return show(target.diff(*args.names, expect=args.expect, ranks=ranks, **options))
            session = self._running()
            if args.watch:
                return session.diff_watch(name, args.every, args.optim, raise_=args.raise_)
            if args.stop:
                return session.diff_stop(name)
            view = session.diff_report(name) if args.report else None
            show(view or session.diff(*args.names, expect=args.expect, ranks=ranks, **options))
        except (ConfigError, SessionError) as exc:
            raise UsageError(str(exc)) from None

    @magic_arguments()
    @argument("names", nargs="*", help="names (or dotted paths) to show; default: every tensor")
    @argument("--all", action="store_true", help="include _private and IPython's own names")
    @argument("--ranks", type=str, default=None, help="these ranks only, e.g. 0-3,6")
    @line_magic
    def dist_shapes(self, line: str) -> None:
        """Per-rank shape table: `%dist_shapes [NAME ...] [--all] [--ranks 0-3]`; differences
        come first."""
        args = parse(self.dist_shapes, line)
        target = self.target()
        try:
            show(target.shapes(args.names or None, all=args.all, ranks=rank_list(args.ranks)))
        except (ConfigError, SessionError) as exc:
            raise UsageError(str(exc)) from None

    @magic_arguments()
    @argument("--cells", type=str, default=None, help="only the last N cells")
    @argument("--export", default=None, help="also write a Chrome/Perfetto trace to PATH.json")
    @line_magic
    def dist_timeline(self, line: str) -> None:
        """Collectives per rank over time: `%dist_timeline [--cells N] [--export PATH.json]`."""
        args = parse(self.dist_timeline, line)
        cells = whole(args.cells, "--cells") if args.cells is not None else None
        target = self.target()
        if target is not self.session:
            self._on_ranks_only(args, "cells")
            view = self._job().timeline()
        else:
            view = self._running().timeline(cells)
        if args.export:
            view.export_chrome_trace(args.export)
            print(f"distnb: wrote {args.export} (open it in https://ui.perfetto.dev)")
        show(view)

    @magic_arguments()
    @argument("--steps", type=str, default=None, help="until N optimizer steps (default: --report)")
    @argument("--report", action="store_true", help="stop; show the steps by phase, the straggler")
    @argument("--export", default=None, help="--report: also write a Perfetto trace to PATH.json")
    @argument("--ranks", type=str, default=None, help="these ranks only, e.g. 0-3,6")
    @line_magic
    def dist_profile(self, line: str) -> None:
        """Profile the next cells on every rank: `%dist_profile [--steps N] [--ranks 0-1]`, then
        `%dist_profile --report [--export PATH.json]` shows each rank's steps by phase and who
        is slow and why (`%%allranks --profile` does both for one cell). On an attached job:
        its next N optimizer steps (without --steps: until --report)."""
        args = parse(self.dist_profile, line)
        target = self.target()
        try:
            if args.report:
                view = target.profile_report()
                if args.export:
                    view.export_chrome_trace(args.export)
                    print(f"distnb: wrote {args.export} (open it in https://ui.perfetto.dev)")
                return show(view)
            if args.export:
                raise UsageError(
                    "--export goes with --report: %dist_profile --report --export p.json"
                )
            steps = whole(args.steps, "--steps") if args.steps is not None else None
            target.profile(steps, ranks=rank_list(args.ranks))
        except (ConfigError, SessionError) as exc:
            raise UsageError(str(exc)) from None
        if target is self.session:
            until = f" until {steps} optimizer steps" if steps else ""
            until = until or f" (at most {MOST_STEPS} optimizer steps)"
            print(f"distnb: profiling the next cells{until}; %dist_profile --report shows them")
        else:
            print(f"distnb: {profiling_steps(steps)}; %dist_profile --report shows them")

    @magic_arguments()
    @argument("name", nargs="?", default=None, help="the module in each rank's namespace")
    @argument("--frames", type=str, default="21", help="frames kept before the first NaN/Inf")
    @argument("--trace-batches", default="", help="steps whose every frame is kept, e.g. 1,3")
    @argument("--abort-after", type=str, default=None, help="stop the ranks after step N")
    @argument("--stop", action="store_true", help="stop the ranks at the first NaN/Inf")
    @argument("--stats", default="fast", help="fast (default), auto (+ counts) or full")
    @argument("--detach", action="store_true", help="remove the trace from NAME")
    @argument("--report", action="store_true", help="show every trace's report")
    @argument("--ranks", type=str, default=None, help="these ranks only, e.g. 0-3,6")
    @line_magic
    def dist_overflow(self, line: str) -> None:
        """Trace inf/NaN and fp16/bf16 headroom per module, forward and backward, per rank."""
        args = parse(self.dist_overflow, line)
        target, ranks = self.target(), rank_list(args.ranks)
        try:
            if args.report:
                views = target.overflow_report(ranks)
                if not views:
                    print("distnb: no overflow trace; start one with %dist_overflow NAME")
                for view in views.values():
                    show(view)
            elif args.name is None:
                raise UsageError("name the module to trace: %dist_overflow model")
            elif args.detach:
                if target is not self.session:
                    self._on_ranks_only(args, "detach")
                self._running().overflow_detach(args.name)
            else:
                target.overflow(
                    args.name,
                    ranks,
                    frames=whole(args.frames, "--frames"),
                    trace_batches=numbers(args.trace_batches, "--trace-batches"),
                    abort_after=whole(args.abort_after, "--abort-after")
                    if args.abort_after is not None
                    else None,
                    stop_on_nonfinite=args.stop,
                    stats=args.stats,
                )
        except (ConfigError, SessionError) as exc:
            raise UsageError(str(exc)) from None

    @magic_arguments()
    @argument("--timeout", type=str, default=None, help="seconds before a hang report")
    @argument("--unchecked", action="store_true", help="run without collective checks")
    @argument("script", help="the Python file to run on every rank, as torchrun would")
    @argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    @line_magic
    def dist_run(self, line: str) -> None:
        """Run a script on every rank as `__main__`: `%dist_run [--timeout S] train.py --lr 0.1`.

        A script written for `torchrun --nproc-per-node N` runs unchanged; options of
        %dist_run come before the script, everything after it is the script's.
        """
        args = parse(self.dist_run, line)
        session = self._running()
        shown(
            lambda: session.run_script(
                args.script, args.args, timeout=seconds(args.timeout), check=not args.unchecked
            )
        )

    @magic_arguments()
    @argument("state", nargs="?", choices=["on", "off"], help="on or off (default: switch)")
    @argument("--ranks", type=str, default=None, help="these ranks only, e.g. 0-3,6 (or 0,2, all)")
    @argument("--timeout", type=str, default=None, help="seconds before a hang report")
    @argument("--unchecked", action="store_true", help="run without collective checks")
    @line_magic
    def dist_auto(self, line: str) -> None:
        """Auto mode: `%dist_auto on [--ranks 0-1] [--timeout S] [--unchecked]` runs every
        following cell on the ranks, as with %%allranks, until `%dist_auto off`; a cell that
        starts with %%local runs in the kernel meanwhile (`%%dist_auto`, which auto mode writes
        in front of each cell, is the mode's own: `distnb.session.automode`)."""
        args = parse(self.dist_auto, line)
        mode = AutoMode.of(self.shell)
        on = args.state == "on" if args.state else not mode.active
        try:
            if on:
                self._running().auto(
                    True,
                    ranks=rank_list(args.ranks),
                    timeout=seconds(args.timeout),
                    check=not args.unchecked,
                )
            else:
                mode.disable()
        except (ConfigError, SessionError) as exc:
            raise UsageError(str(exc)) from None

    @cell_magic
    def local(self, line: str, cell: str) -> None:
        """Run this cell in the kernel, not on the ranks (for auto mode: `%dist_auto`). Once
        auto mode is on, its input transformer runs %%local cells before this can."""
        assert self.shell is not None
        self.shell.run_cell(cell, store_history=False)

    @magic_arguments()
    @argument("names", nargs="+", help="names (or dotted paths) on the ranks")
    @argument("--ranks", type=str, default=None, help="these ranks only, e.g. 0-3,6 (or 0,2, all)")
    @argument("--limit", type=str, default=None, help="most bytes per rank, e.g. 1GiB")
    @argument("--as", dest="as_name", default=None, help="the kernel's name for one value")
    @line_magic
    def dist_pull(self, line: str) -> None:
        """Each rank's value of NAME into the kernel's NAME, a list in rank order (tensors on
        the CPU): `%dist_pull losses [--ranks 0-1] [--limit 1GiB] [--as per_rank]`."""
        args = parse(self.dist_pull, line)
        target = self.target()
        if args.as_name is not None and len(args.names) != 1:
            raise UsageError("--as names one value: %dist_pull losses --as per_rank")
        ranks = rank_list(args.ranks)
        for name in args.names:
            try:
                values = target.pull(name, ranks=ranks, limit=size(args.limit))
            except (ConfigError, SessionError) as exc:
                raise UsageError(str(exc)) from None
            var = args.as_name or name.rsplit(".", 1)[-1]
            self._user_ns()[var] = values
            print(f"distnb: {var} = [{name} of each rank], {len(values)} values in rank order")

    @magic_arguments()
    @argument("names", nargs="+", help="the kernel's names to bind on the ranks")
    @argument("--ranks", type=str, default=None, help="these ranks only, e.g. 0-3,6 (or 0,2, all)")
    @argument("--limit", type=str, default=None, help="most bytes per value, e.g. 1GiB")
    @line_magic
    def dist_push(self, line: str) -> None:
        """Bind the kernel's values to the same names on every rank:
        `%dist_push lr targets [--ranks 0-1] [--limit 1GiB]`."""
        args = parse(self.dist_push, line)
        target = self.target()
        ns = self._user_ns()
        missing = [n for n in args.names if n not in ns]
        if missing:
            raise UsageError(f"the kernel has no {', '.join(missing)}: assign it here first")
        values = {n: ns[n] for n in args.names}
        ranks = rank_list(args.ranks)
        try:
            target.push(ranks=ranks, limit=size(args.limit), **values)
        except (ConfigError, SessionError) as exc:
            raise UsageError(str(exc)) from None

    def _user_ns(self) -> dict[str, Any]:
        return self.shell.user_ns  # type: ignore[no-any-return,union-attr]

    def _running(self) -> Session:
        if self.session is None or not self.session.running:
            raise UsageError("no distnb cluster is running: start one with %dist_start -n 2")
        return self.session

    def _job(self) -> Any:
        if self.attach is None:
            return None
        self.attach.forget_ended()  # a job that ended while attached (said when found)
        return self.attach.job

    def target(self) -> Target:
        """What the tools act on: the attached job while one is attached (said once when a
        session runs beside it), else the running session."""
        job = self._job()
        if job is None:
            return self._running()
        if self.session is not None and self.session.running and self._told is not job:
            self._told = job
            print(
                f"distnb: on the attached job {job.link.endpoint.run}; %dist_attach --detach "
                "returns these tools to the session's ranks"
            )
        return cast("Target", job)

    def _on_ranks_only(self, args: Any, *flags: str) -> None:
        """A UsageError for options that only distnb's own ranks have."""
        given = [f for f in flags if getattr(args, f, None) not in (None, False, "")]
        if given:
            raise UsageError(
                f"--{given[0]} works on distnb's own ranks, not on an attached job's stopped "
                "ranks; %dist_attach --detach first, or leave it out"
            )
