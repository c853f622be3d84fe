"""`%dist_attach` and `%%attached`: the notebook on a job distnb did not start.

Thin shells over `distnb.attach` and the `AttachedJob` it returns; the job is held here (one
per shell), not in a module global.
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from distnb.errors import ConfigError, Interrupted, SessionError
from distnb.magics.args import parse, rank_list, whole
from distnb.ranklist import format_ranks
from distnb.records.attach import AgentState
from distnb.records.profiling import MOST_STEPS
from distnb.views.display import show

__all__ = ["AttachMagics"]

# options %dist_attach once had, now the session's own magics acting on the attached job
# How long `%dist_attach --stop` waits to say where the ranks stopped: a stop where a rank is
# comes at once; one at the next collective may never come (a hung rank), and is said as asked.
STOP_SAID_S = {"now": 10.0, "later": 1.0}
MOVED = {
    "--shapes": "%dist_shapes",
    "--diff": "%dist_diff",
    "--overflow": "%dist_overflow",
    "--overflow-report": "%dist_overflow --report",
    "--timeline": "%dist_timeline",
}


@magics_class
class AttachMagics(Magics):
    """`%dist_attach`, `%%attached`."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.job: Any = None  # distnb.session.attach.AttachedJob

    @magic_arguments()
    @argument(
        "target",
        nargs="?",
        default=None,
        help="run folder, run id, Slurm job id, host:port (--no-agent: launcher pid or run id)",
    )
    @argument("--no-agent", action="store_true", help="a job without distnb's agent: py-spy stacks")
    @argument("--hosts", default=None, help="--no-agent: look on these hosts over ssh: h1,h2")
    @argument("--stop", action="store_true", help="stop ranks before their next collective")
    @argument("--at", default="collective", help="--stop at: collective, step, or now")
    @argument("--ranks", type=str, default=None, help="--stop, --break: these ranks, e.g. 0-3,6")
    @argument("--break", dest="where", default=None, help="a breakpoint at FILE:LINE")
    @argument("--if", dest="cond", default=None, help="--break: only where this is true")
    @argument("--debug", action="store_true", help="answer the stopped ranks' debugger here")
    @argument("--panel", action="store_true", help="the stopped ranks in JupyterLab's debugger")
    @argument("--profile", default=None, help="profile the next N optimizer steps: who is slow")
    @argument("--resume", action="store_true", help="let stopped and held ranks go on")
    @argument("--detach", action="store_true", help="let the job go on as it would have")
    @line_magic
    def dist_attach(self, line: str) -> Any:
        """Attach to a job distnb did not start (`python -m distnb.run ... train.py`):
        `%dist_attach [RUN]` shows each rank's state, the verdicts and the live stacks;
        `--stop [--at step|now] [--ranks 0]`, `--break train.py:52 [--if COND]`, `--debug`,
        `--panel` (the stopped ranks in JupyterLab's debugger panel), `--resume`, `--detach`;
        `--profile N [--ranks 0-3]` profiles every rank's next N optimizer steps and shows them
        by phase, with who is slow and why.
        While a job is attached, `%dist_status`, `%dist_shapes`, `%dist_diff`,
        `%dist_overflow` and `%dist_timeline` act on it (on the frames its stopped ranks are
        stopped in). `--no-agent`: a plain torchrun job, py-spy stacks only: the only one on
        this machine, else the one that looks hung, else the list to name one from (its
        launcher pid or run id); `--hosts h1,h2`: on those hosts, over ssh."""
        from distnb.session.attach import attach, attach_processes

        moved = next((f for f in MOVED if f in line.split()), None)
        if moved is not None:
            raise UsageError(
                f"%dist_attach {moved} is {MOVED[moved]}: while a job is attached, the "
                "session's tools act on it"
            )
        args = parse(self.dist_attach, line)
        ranks = rank_list(args.ranks)
        doing = "looked for the job"  # what Ctrl-C cuts, said in one line (`_interrupted`)
        try:
            if args.no_agent:
                hosts = [h for h in (args.hosts or "").split(",") if h]
                return attach_processes(args.target, hosts=hosts)
            if args.detach:
                doing = "let go of the job"
                return self._detach()
            if self.job is None or args.target is not None:
                self._detach()
                doing = "attached"
                self.job = attach(args.target)
            job = self.job
            which = format_ranks(job.pick(ranks))
            if args.where:
                doing = "set the breakpoint"
                job.breakpoint(args.where, args.cond, ranks)
                cond = f" if {args.cond}" if args.cond else ""
                print(f"distnb: a breakpoint at {args.where}{cond} on {which}")
            if args.stop:
                doing = "asked the ranks to stop"
                job.stop(ranks, at=args.at)
                doing = "waited for the ranks to stop"
                print(_stopping(job, job.pick(ranks), args.at))
            if args.debug:
                doing = "served the stopped ranks' debugger"
                return job.debug()
            if args.panel:
                doing = "waited for a rank to stop for the panel"
                shown = format_ranks(job.panel())
                return print(f"distnb: JupyterLab's debugger panel shows {shown}")
            if args.resume:
                doing = "let the ranks go on"
                job.resume(ranks)
                return print(f"distnb: {which} go on")
            if args.profile is not None:
                steps = whole(args.profile, "--profile")
                doing = "asked the ranks for a profile"
                job.profile(steps, ranks)
                print(f"distnb: {profiling_steps(steps)}")
                doing = "waited for the profile"
                return show(job.profile_report())
            if args.stop or args.where:
                return None
            doing = "read the ranks' status"
            view = job.status()
            self.forget_ended()
            return view
        except (ConfigError, SessionError, RuntimeError) as exc:
            raise UsageError(self._words(exc)) from None
        except KeyboardInterrupt:
            raise Interrupted(self._interrupted(doing)) from None

    def _interrupted(self, doing: str) -> str:
        """The one line for Ctrl-C in `%dist_attach`: what it cut, and the state it left."""
        said = f"%dist_attach was interrupted while it {doing}"
        job = self.job
        if job is None or not job.attached:
            return f"{said}: no job is attached; %dist_attach attaches again"
        run = job.link.endpoint.run
        if "to stop" in doing:  # the stop's requests are posted whole (`AttachedJob.stop`)
            return (
                f"{said}: still attached to job {run}; the stop was asked, and the ranks stop "
                "as asked (%dist_status shows where, %dist_attach --resume lets them go on)"
            )
        if "profile" in doing:
            return (
                f"{said}: still attached to job {run}; the ranks profile the steps asked "
                "(%dist_profile --report shows them once they have)"
            )
        try:
            snaps = job.snapshots(1.0)
        except (SessionError, RuntimeError, KeyboardInterrupt):
            return f"{said}: still attached to job {run}; %dist_status shows it"
        stopped = [s.rank for s in snaps if s.state in (AgentState.STOPPED, AgentState.HELD)]
        now = f"{format_ranks(stopped)} stopped or held" if stopped else "no rank stopped"
        after = "; %dist_attach --resume lets them go on" if stopped else ""
        return f"{said}: still attached to job {run}, {now}{after}"

    @magic_arguments()
    @argument("--ranks", type=str, default=None, help="these ranks only, e.g. 0-3,6 (or 0,2, all)")
    @cell_magic
    def attached(self, line: str, cell: str) -> None:
        """Run the cell in the frames the attached job's stopped ranks are stopped in."""
        args = parse(self.attached, line)
        if self.job is None:
            raise UsageError("no job is attached: %dist_attach RUN, then %dist_attach --stop")
        ranks = rank_list(args.ranks)
        try:
            self.job.run(cell, ranks)
        except (ConfigError, SessionError, RuntimeError) as exc:
            raise UsageError(self._words(exc)) from None

    def _detach(self) -> None:
        if self.job is not None:
            gone = self.job.gone
            self.job.detach()
            if not gone:
                print("distnb: detached; the job goes on as it would have")
        self.job = None

    def _words(self, exc: BaseException) -> str:
        """What went wrong, in one line; a job whose control plane went away (it ended while
        attached) is let go, so that the next %dist_attach attaches to the next run."""
        from distnb.session.attach.job import connection_lost

        if isinstance(exc, RuntimeError) and not connection_lost(exc):
            raise exc
        job = self.job
        if job is not None and (job.gone or connection_lost(exc)):
            job.gone = True
            self.forget_ended()
            return str(job.ended_words())
        return str(exc)

    def forget_ended(self) -> None:
        if self.job is not None and self.job.gone:
            self.job.detach()
            self.job = None


def _stopping(job: Any, chosen: list[int], at: str) -> str:
    """What `%dist_attach --stop` did: where the ranks stopped, once they have (a rank asked to
    stop where it is, at once; at its next collective or step, if it gets there within
    `STOP_SAID_S`), and which are still on their way."""
    stopped = job.stopped(chosen, STOP_SAID_S["now" if at == "now" else "later"])
    lines = [f"distnb: {format_ranks([s.rank])} stopped at {_where(s)}" for s in stopped]
    left = [r for r in chosen if r not in {s.rank for s in stopped}]
    if left:
        its, here = ("its", "where it is") if len(left) == 1 else ("their", "where they are")
        point = {"step": f"at {its} next optimizer step", "now": here}.get(
            at, f"at {its} next collective"
        )
        lines.append(f"distnb: stopping {format_ranks(left)} {point}; %dist_status shows where")
    return "\n".join(lines)


def _where(snap: Any) -> str:
    top = snap.stack[-1] if snap.stack else None
    return snap.where or (f"{top.file}:{top.line} in {top.function}" if top else "?")


def profiling_steps(steps: int | None) -> str:
    """What a profile asked of an attached job records (`%dist_attach --profile`,
    `%dist_profile` on an attached job)."""
    which = (
        f"the next {steps} optimizer steps"
        if steps
        else f"the optimizer steps until --report (at most {MOST_STEPS})"
    )
    return f"profiling {which}, from the end of the step each rank is in"
