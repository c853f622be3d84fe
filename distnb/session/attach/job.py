"""`AttachedJob`: a running job distnb did not start, seen and driven from the notebook.

Reading (`status`, `verdicts`, `timeline`) asks every rank's agent at once and judges what comes
back with the functions distnb uses on its own ranks (`verdict`). A rank that does not answer is
still shown: gone (its process has ended), or silent (alive, its serving thread not answering:
its GIL held in native code), with its py-spy stack where py-spy is installed and the rank is on
this machine.

Profiling (`profile`, `profile_report`) runs `torch.profiler` on the ranks for a number of
optimizer steps and judges what they recorded as distnb's own ranks' profiles are.

Driving (`stop`, `breakpoint`, `debug`, `run`, `detach`) goes through the agents' control
(`distnb.rank.agent.safepoints`): stopped ranks' prompts are served by the text debugger's desk,
or handed to JupyterLab's debugger panel (`panel`), peers are held before their next collective
while a rank is stopped, and `detach` lets every rank go on exactly as it would have.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from distnb import interrupts
from distnb.contract.folders import RunFolder
from distnb.contract.storewire import StoreGone
from distnb.errors import ConfigError, SessionError
from distnb.judgement import snapshot
from distnb.judgement.endings import endings
from distnb.ranklist import RankArg, rank_arg
from distnb.records.agent import (
    AgentRequest,
    Break,
    Detach,
    Events,
    Hold,
    Recorded,
    Release,
    Reply,
    Status,
    Stop,
    StopAt,
    Taped,
    answer_line,
)
from distnb.records.attach import AgentState, RankSnapshot
from distnb.records.collective import CollectiveEvent, Fingerprint
from distnb.records.profiling import RankProfile
from distnb.session.attach import inside, profiling
from distnb.session.attach.link import Link
from distnb.session.attach.panel import JobPanel, relay
from distnb.session.attach.procs import pyspy_stack
from distnb.session.attach.prompts import DeskPrompts, JobPrompts
from distnb.session.load import stretched
from distnb.views.attach import JobView

if TYPE_CHECKING:
    from distnb.session.debugger.desk import Desk

__all__ = ["AttachedJob"]

TAPE_KEPT = 1000  # of each rank's calls, the last kept here (`events`)
RESUMED_S = 2.0  # how long `resume` waits to see the ranks it let go leave their stop
# How long `debug` waits, after an answer, for a rank to stop again (a step over a collective
# waits for the held peers to be let go and to get there); longer on a loaded machine.
STEPPED_S = 1.0
STEPPED_MOST_S = 10.0


class AttachedJob:
    """A job attached through its run folder (see `distnb.attach`)."""

    def __init__(self, folder: RunFolder, link: Link, world_size: int) -> None:
        self.folder = folder
        self.link = link
        self.ranks = list(range(world_size))
        self.prompts = JobPrompts(link.store, self.ranks)
        self.attached = True
        self.gone = False  # its control plane went away: the job ended while attached
        # breakpoints set from the notebook, per rank: file found there -> as DAP writes them
        self.breaks: dict[int, dict[str, list[dict[str, Any]]]] = {}
        self.visual: JobPanel | None = None  # JupyterLab's panel on the ranks
        # per rank: the number of its first call kept, and its calls, the last `TAPE_KEPT`
        # (`events` asks for what is new or not ended since)
        self.tapes: dict[int, tuple[int, list[Recorded]]] = {}
        self.profiling: list[int] = []  # ranks asked for a profile (`profiling`), not reported
        self.profiled: dict[int, RankProfile] = {}  # ... their profiles handed over so far

    def __repr__(self) -> str:
        e = self.link.endpoint
        return f"<AttachedJob {e.run}: {len(self.ranks)} ranks, {e.host}:{e.port}>"

    def __enter__(self) -> AttachedJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    # --- reading ------------------------------------------------------------------------------

    def snapshots(self, timeout_s: float = 2.0) -> list[RankSnapshot]:
        """Each rank's state and live stack, in rank order (every rank gone, once the job has
        ended)."""
        if self.gone:
            return [self._ended(rank) for rank in self.ranks]
        try:
            replies = self._ask(Status(), None, timeout_s)
        except SessionError:
            if not self.gone:
                raise
            return [self._ended(rank) for rank in self.ranks]
        out = []
        for rank in self.ranks:
            reply = replies.get(rank)
            if reply is not None and reply.ok:
                out.append(RankSnapshot.from_dict(reply.value))
            else:
                out.append(self._silent(rank))
        return out

    def finals(self) -> dict[int, RankSnapshot]:
        """The last snapshots of the ranks that have ended, as their agents wrote them
        (`distnb.rank.agent.ending`): how each ended, and what it was doing."""
        return {r: RankSnapshot.from_dict(d) for r, d in self.folder.finals().items()}

    def _silent(self, rank: int) -> RankSnapshot:
        info = self.link.registered(rank)
        host, pid = (info.host, info.pid) if info is not None else ("?", 0)
        here = host == socket.gethostname()
        final = self.finals().get(rank)
        if final is not None and (not here or not _alive(pid)):
            return final
        if info is None:
            words = "has not started its agent (the script has not imported torch yet?)"
        elif here and not _alive(pid):
            words = f"ended (process {pid} is gone)"
        else:
            words = "does not answer (alive; its GIL held in native code?)"
        stack = pyspy_stack(pid) if here and pid and _alive(pid) else ()
        source = "py-spy" if stack else "agent"
        return RankSnapshot(
            rank,
            host,
            pid,
            AgentState.GONE,
            len(self.ranks),
            stack=stack,
            where=words,
            source=source,
        )

    def _ended(self, rank: int) -> RankSnapshot:
        final = self.finals().get(rank)
        gone = RankSnapshot(rank, "", 0, AgentState.GONE, len(self.ranks), where="ended")
        return final if final is not None else gone

    def ended_words(self) -> str:
        """The one line for a job whose control plane went away while attached: how it ended,
        and what its ranks did last (`distnb.judgement.endings`)."""
        status = self.folder.ended()
        how = f" (exit status {status})" if status is not None else ""
        said = "; ".join(endings(self.finals(), len(self.ranks))) or "its control plane is gone"
        return (
            f"job {self.link.endpoint.run} has ended{how}: {said}; %dist_attach attaches to "
            "the next run (distnb.attach())"
        )

    def events(self, last: int = 1000) -> dict[int, list[tuple[CollectiveEvent, Fingerprint]]]:
        """Each rank's last `last` collectives (at most `TAPE_KEPT`), with their fingerprints.

        The notebook keeps a copy of each rank's and asks only from its first call not ended
        (or after the last it has): a hung job's verdicts move nothing new."""
        asks = {
            r: Events(TAPE_KEPT, self.tapes[r][0] if r in self.tapes else 0) for r in self.ranks
        }
        for rank, reply in self._ask_each(asks, 5.0).items():
            self.tapes[rank] = _kept(self.tapes.get(rank), Taped.from_dict(reply.value))
        return {
            rank: [(e.event, e.fingerprint) for e in self.tapes[rank][1][-last:]]
            for rank in sorted(self.tapes)
        }

    def verdicts(self, snapshots: Sequence[RankSnapshot] | None = None) -> list[str]:
        """Who waits for whom, where, and why; mismatches the records show
        (`distnb.judgement.snapshot`)."""
        snaps = self.snapshots() if snapshots is None else snapshots
        recorded = self.events()
        return snapshot.verdicts(
            snaps,
            {r: [e for e, _ in es] for r, es in recorded.items()},
            {r: [f for _, f in es] for r, es in recorded.items()},
        )

    def status(self) -> JobView:
        """The status table, the verdicts and the grouped live stacks (`%dist_attach`)."""
        snaps = self.snapshots()
        e = self.link.endpoint
        ended = self.folder.ended()
        title = (
            f"job {e.run} ({len(self.ranks)} ranks, launcher pid {e.launcher_pid} on {e.hostname})"
        )
        if ended is not None:
            title += f": ended, exit status {ended}"
        elif self.gone:
            title += ": ended (its control plane is gone)"
        if self.gone:
            return JobView(title, tuple(snaps), tuple(endings(self.finals(), len(self.ranks))))
        return JobView(title, tuple(snaps), tuple(self.verdicts(snaps)))

    def timeline(self, last: int = 200) -> Any:
        """The last collectives of every rank on a timeline (`distnb.views.timeline`)."""
        from distnb.views.timeline import TimelineView

        events = [e for es in self.events(last).values() for e, _ in es]
        return TimelineView(events)

    # --- driving ------------------------------------------------------------------------------

    def stop(self, ranks: RankArg | None = None, at: str = "collective") -> None:
        """Stop `ranks` (default: all) in the debugger before their next collective, after
        their next optimizer step (`at="step"`), or at once where they are (`at="now"`: a rank
        blocked in a lock, a sleep or I/O too); the other ranks are held before their next
        collective meanwhile. Then `debug()` (or `run(code)`)."""
        try:
            point = StopAt(at)
        except ValueError:
            *most, last = (repr(p.value) for p in StopAt)
            known = f"{', '.join(most)} or {last}"
            raise ConfigError(f"at is {known}, not {at!r}") from None
        chosen = self.pick(ranks)
        self.link.start_lease()
        with interrupts.held() as noted:  # stopped ranks and held peers together (Ctrl-C after)
            self._ask(Stop(point), chosen)
            others = [r for r in self.ranks if r not in chosen]
            if others:
                self._ask(Hold(), others)
        noted.check()

    def stopped(self, ranks: RankArg | None = None, wait_s: float = 0.0) -> list[RankSnapshot]:
        """The snapshots of `ranks` (default: all) that are stopped, once all of them are or
        `wait_s` has passed."""
        chosen = self.pick(ranks)
        deadline = time.monotonic() + wait_s
        while True:
            snaps = [s for s in self.snapshots(1.0) if s.rank in chosen]
            stopped = [s for s in snaps if s.state is AgentState.STOPPED]
            if len(stopped) == len(chosen) or time.monotonic() >= deadline:
                return stopped
            time.sleep(0.05)

    def breakpoint(self, where: str, cond: str | None = None, ranks: RankArg | None = None) -> None:
        """A breakpoint at `file:line` (a path, or the end of one: `train.py:52`) on `ranks`
        (default: all), with an optional condition; it takes effect at the rank's next
        collective or step (at once on a rank in JupyterLab's panel, `panel`). A file or line
        the rank does not have is refused, with why."""
        file, _, line = where.rpartition(":")
        if not file or not line.isdigit():
            raise ConfigError(f"a breakpoint is FILE:LINE, e.g. train.py:52, not {where!r}")
        self.link.start_lease()
        request = Break(file, int(line), cond or None)
        chosen = self.pick(ranks)
        shown = [r for r in chosen if self.visual is not None and self.visual.connected(r)]
        found = self._ask(request, [r for r in chosen if r not in shown])
        found |= self._ask(replace(request, check=True), shown)  # the panel's: set in debugpy
        mark = {"line": int(line), **({"condition": cond} if cond else {})}
        for rank, reply in found.items():
            path = str(reply.value)
            lines = self.breaks.setdefault(rank, {}).setdefault(path, [])
            lines.append(mark)
            if rank in shown and self.visual is not None:
                self.visual.set_breaks(rank, path, lines)

    def panel(self, wait_s: float = 30.0) -> list[int]:
        """Show the stopped ranks in JupyterLab's debugger panel (switched on with its bug icon):
        each a thread `rank N`, with its stack, scopes and variables; `next`, `step` and
        `continue` go to that rank, and the ranks not stopped are held before their next
        collective meanwhile. Breakpoints set from the notebook stop ranks in the panel from
        then on. Waits up to `wait_s` for a rank to stop; returns the ranks shown.

        >>> job.breakpoint("train.py:52"); job.panel()
        """
        to = relay()
        if self.visual is None:
            self.visual = JobPanel(self, to)
        return self.visual.show(self.breaks, wait_s)

    def debug(self, wait_s: float = 60.0) -> None:
        """Serve the stopped ranks' debugger prompts here (pdb's commands; `ranks`, `rank N`)
        until no rank is stopped; wait up to `wait_s` for a first one to stop.

        While no rank is stopped after an answer (a rank steps: `n` over a collective), the
        held ranks go on, so that the collective the stepping rank is in can complete; they
        are held again once a rank stops again."""
        from distnb.session.debugger.desk import Desk

        desk = Desk(DeskPrompts(self.prompts), 0)
        deadline = time.monotonic() + wait_s
        served = False
        released: list[int] = []  # held ranks let go while a stopped rank steps
        while not self.gone:
            if self._serve(desk):
                served = True
                deadline = time.monotonic() + stretched(STEPPED_S, STEPPED_MOST_S)
            snaps = self.snapshots(1.0)
            if any(s.state is AgentState.STOPPED for s in snaps):
                deadline = max(deadline, time.monotonic() + 1.0)
                self.prompts.words = {s.rank: s.state.value for s in snaps}
            elif time.monotonic() > deadline:
                break
            if served and not self.gone:
                released = self._held_while_stepping(snaps, released)
            time.sleep(0.05)
        if not self.gone:  # the job may end once its ranks go on
            self._ask(Release(), None)

    def _serve(self, desk: Desk) -> float:
        """`desk.serve`: the seconds spent with the user; 0 once the job has ended (its ranks
        went on and finished)."""
        try:
            return desk.serve(self.prompts)
        except RuntimeError as exc:
            self._lost(exc)
            return 0.0

    def _held_while_stepping(self, snaps: Sequence[RankSnapshot], released: list[int]) -> list[int]:
        """Let the held ranks go while no rank is stopped, and hold them again once one is
        (`debug`); the ranks let go and not held again yet."""
        stopped = [s.rank for s in snaps if s.state is AgentState.STOPPED]
        if stopped:
            if released:
                self._ask(Hold(), [r for r in released if r not in stopped])
            return []
        held = [s.rank for s in snaps if s.state is AgentState.HELD]
        if held:
            self._ask(Release(), held)
        return sorted({*released, *held})

    def open_prompts(self, wait_s: float) -> list[Any]:
        """The stopped ranks' open prompts, once one is there (or no rank is stopping)."""
        deadline = time.monotonic() + wait_s
        while True:
            found = self.prompts.asks()
            if found or time.monotonic() > deadline:
                return found
            if not any(s.state is AgentState.STOPPED for s in self.snapshots(1.0)):
                return found
            time.sleep(0.02)

    def resume(self, ranks: RankArg | None = None) -> None:
        """Let stopped ranks go on (`c` at their prompts) and release the held ones, leaving
        breakpoints and overflow watches in place (`detach` removes them)."""
        asked = {r.rank: r for r in self.prompts.asks()}
        for rank in self.pick(ranks):
            if rank in asked:
                self.prompts.answer(asked[rank].n, "c")
        if self.visual is not None:
            self.visual.resume(self.pick(ranks))
        self._ask(Release(), None)
        deadline = time.monotonic() + RESUMED_S  # so that what is said next says they went on
        waiting = (AgentState.STOPPED, AgentState.HELD)
        chosen = self.pick(ranks)
        while time.monotonic() < deadline and any(
            s.state in waiting for s in self.snapshots(1.0) if s.rank in chosen
        ):
            time.sleep(0.05)

    # looking inside stopped ranks (`inside`): code in their frames, shapes, replicas, overflow
    run = inside.run
    shapes = inside.shapes
    diff = inside.diff
    overflow = inside.overflow
    overflow_report = inside.overflow_report
    pull = inside.pull
    push = inside.push
    # their steps profiled (`profiling`): who is slow and why
    profile = profiling.profile
    profile_report = profiling.profile_report

    def detach(self) -> None:
        """Let every rank go on as it would have: breakpoints cleared, holds released, stopped
        ranks resumed, a profile under way dropped; the notebook lets go of the job's control
        plane."""
        if not self.attached:
            return
        if self.gone:  # nothing left to let go of
            self.attached = False
            return
        try:
            self._ask(Detach(), None)
        except SessionError:
            if not self.gone:
                raise
            self.attached = False
            return
        for request in self.prompts.asks():
            self.prompts.answer(request.n, answer_line(Detach()))
        if self.visual is not None:  # last: ranks in the panel go on, the job may end at once
            self.visual.close()
            self.visual = None
        self.breaks.clear()
        self.profiling, self.profiled = [], {}  # the ranks dropped theirs
        self.link.close()
        self.attached = False

    # --- helpers ------------------------------------------------------------------------------

    def pick(self, ranks: RankArg | None) -> list[int]:
        try:
            ranks = rank_arg(ranks)  # "0-3,6" reads as --ranks does
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if ranks is None:
            return list(self.ranks)
        bad = [r for r in ranks if r not in self.ranks]
        if bad:
            raise ConfigError(f"the job has ranks 0-{len(self.ranks) - 1}; no rank {bad[0]}")
        return list(ranks)

    def _lost(self, exc: RuntimeError) -> None:
        """Note that the job has ended, if `exc` says its control plane is gone (its launcher,
        which hosts it, has ended); else raise `exc` again."""
        if not connection_lost(exc):
            raise exc
        self.gone = True
        self.link.close()

    def _ask(
        self, request: AgentRequest, ranks: Sequence[int] | None, timeout_s: float = 2.0
    ) -> dict[int, Reply]:
        return self._ask_each(
            dict.fromkeys(self.ranks if ranks is None else ranks, request), timeout_s
        )

    def _ask_each(
        self, requests: Mapping[int, AgentRequest], timeout_s: float = 2.0
    ) -> dict[int, Reply]:
        if not self.attached:
            raise SessionError("this job is detached: attach again with distnb.attach(...)")
        if self.gone:
            raise SessionError(self.ended_words())
        try:
            replies = self.link.ask_each(requests, timeout_s)
        except RuntimeError as exc:
            self._lost(exc)
            raise SessionError(self.ended_words()) from None
        errors = {r: rep.error for r, rep in replies.items() if rep.error is not None}
        if errors:
            rank, error = min(errors.items())
            raise ConfigError(f"rank {rank} refused {requests[rank].kind}: {error}")
        return replies


def _kept(before: tuple[int, list[Recorded]] | None, taped: Taped) -> tuple[int, list[Recorded]]:
    """A rank's copy of its tape (`AttachedJob.tapes`: the number of its first call kept, and
    the calls) with what the rank answered: the calls from `taped.first` on replace those the
    copy had from there (their ends may have come since). A count below the copy's is a rank
    whose agent started again, a first call past the copy's end a gap: it starts over."""
    start, kept = before or (taped.first, [])
    if taped.count < start + len(kept) or not start <= taped.first <= start + len(kept):
        start, kept = taped.first, []  # or more calls came than the rank keeps: a gap
    kept = kept[: taped.first - start] + list(taped.records)
    dropped = max(0, len(kept) - TAPE_KEPT)
    return start + dropped, kept[dropped:]


def _asked_from(copy: tuple[int, list[Recorded]] | None) -> int:
    """Where `events` asks a rank's tape from: its first call in the copy not ended, else the
    call after the copy's last."""
    if copy is None:
        return 0
    start, kept = copy
    return start + next((i for i, r in enumerate(kept) if not r.event.end_ns), len(kept))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def connection_lost(exc: BaseException) -> bool:
    """Is `exc` the job's control plane gone (the link's client says so with `StoreGone`)?"""
    return isinstance(exc, StoreGone)
