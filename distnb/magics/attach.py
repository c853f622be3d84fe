"""`%dist_attach` and `%%attached`: the notebook on a job distnb did not start.

Thin shells over `distnb.attach` and the `AttachedJob` it returns; the job is held here (one
per shell), not in a module global.
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from distnb.errors import ConfigError, SessionError
from distnb.magics.args import parse, rank_list
from distnb.ranklist import format_ranks

__all__ = ["AttachMagics"]


@magics_class
class AttachMagics(Magics):
    """`%dist_attach`, `%%attached`."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.job: Any = None  # distnb.session.attach.AttachedJob

    @magic_arguments()
    @argument("target", nargs="?", default=None, help="run folder, run id, Slurm job id, host:port")
    @argument("--no-agent", action="store_true", help="a job without distnb's agent: py-spy stacks")
    @argument("--hosts", default=None, help="--no-agent: look on these hosts over ssh: h1,h2")
    @argument("--stop", action="store_true", help="stop ranks before their next collective")
    @argument("--at", default="collective", help="--stop at: collective, or step")
    @argument("--ranks", type=str, default=None, help="--stop, --break: these ranks, e.g. 0,2")
    @argument("--break", dest="where", default=None, help="a breakpoint at FILE:LINE")
    @argument("--if", dest="cond", default=None, help="--break: only where this is true")
    @argument("--debug", action="store_true", help="answer the stopped ranks' debugger here")
    @argument("--panel", action="store_true", help="the stopped ranks in JupyterLab's debugger")
    @argument("--timeline", action="store_true", help="the last collectives on a timeline")
    @argument("--shapes", nargs="*", default=None, help="stopped ranks: shape table [of NAMES]")
    @argument("--diff", nargs="+", default=None, help="stopped ranks: compare replicas of NAMES")
    @argument("--overflow", default=None, help="stopped ranks: trace overflow on module NAME")
    @argument("--overflow-report", action="store_true", help="stopped ranks: the traces' report")
    @argument("--resume", action="store_true", help="let stopped and held ranks go on")
    @argument("--detach", action="store_true", help="let the job go on as it would have")
    @line_magic
    def dist_attach(self, line: str) -> Any:
        """Attach to a job distnb did not start (`python -m distnb.run ... train.py`):
        `%dist_attach [RUN]` shows each rank's state, the verdicts and the live stacks;
        `--stop [--at step] [--ranks 0]`, `--break train.py:52 [--if COND]`, `--debug`,
        `--panel` (the stopped ranks in JupyterLab's debugger panel),
        `--timeline`, `--resume`, `--detach`; on stopped ranks, as `%dist_shapes`,
        `%dist_diff` and `%dist_overflow` on distnb's own: `--shapes [NAME ...]`,
        `--diff NAME ...`, `--overflow NAME`, `--overflow-report`. `--no-agent`: a plain
        torchrun job, py-spy stacks only (`--hosts h1,h2`: on those hosts, over ssh)."""
        from distnb.session.attach import attach, attach_processes

        args = parse(self.dist_attach, line)
        ranks = rank_list(args.ranks) if args.ranks is not None else None
        try:
            if args.no_agent:
                hosts = [h for h in (args.hosts or "").split(",") if h]
                return attach_processes(args.target, hosts=hosts)
            if args.detach:
                return self._detach()
            if self.job is None or args.target is not None:
                self._detach()
                self.job = attach(args.target)
            job = self.job
            if args.where:
                job.breakpoint(args.where, args.cond, ranks)
            if args.stop:
                job.stop(ranks, at=args.at)
            if args.debug:
                return job.debug()
            if args.panel:
                shown = format_ranks(job.panel())
                return print(f"distnb: JupyterLab's debugger panel shows {shown}")
            inside = self._inside(job, args, ranks)
            if inside is not None or args.stop or args.where or args.overflow or args.resume:
                return inside
            return job.timeline() if args.timeline else job.status()
        except (ConfigError, SessionError) as exc:
            raise UsageError(str(exc)) from None

    @magic_arguments()
    @argument("--ranks", type=str, default=None, help="comma-separated ranks, e.g. 0,2")
    @cell_magic
    def attached(self, line: str, cell: str) -> None:
        """Run the cell in the frames the attached job's stopped ranks are stopped in."""
        args = parse(self.attached, line)
        if self.job is None:
            raise UsageError("no job is attached: %dist_attach RUN, then %dist_attach --stop")
        ranks = rank_list(args.ranks) if args.ranks is not None else None
        try:
            self.job.run(cell, ranks)
        except (ConfigError, SessionError) as exc:
            raise UsageError(str(exc)) from None

    def _inside(self, job: Any, args: Any, ranks: list[int] | None) -> Any:
        """What `--shapes`, `--diff`, `--overflow[-report]` and `--resume` ask of the job."""
        if args.shapes is not None:
            return job.shapes(args.shapes or None, ranks=ranks)
        if args.diff is not None:
            return job.diff(*args.diff, ranks=ranks)
        if args.overflow:
            job.overflow(args.overflow, ranks=ranks)
        if args.overflow_report:
            views = job.overflow_report(ranks)
            if not views:
                print("distnb: no overflow trace; start one with %dist_attach --overflow NAME")
            return next(iter(views.values())) if len(views) == 1 else (views or None)
        if args.resume:
            job.resume(ranks)
        return None

    def _detach(self) -> None:
        if self.job is not None:
            self.job.detach()
            print("distnb: detached; the job goes on as it would have")
        self.job = None
