"""Profiling an attached job's ranks: `torch.profiler` on each for a number of optimizer steps,
judged and shown as distnb's own ranks' profiles are (`distnb.views.profiling.ProfileView`).
Functions of an `AttachedJob`, bound to it as methods (`AttachedJob.profile`,
`AttachedJob.profile_report`).

>>> job.profile(steps=20)          # %dist_profile --steps 20: from the end of each rank's step
>>> job.profile_report()           # once every rank has profiled 20 steps: who is slow, why
>>> job.profile(); job.profile_report()   # until the report: each rank ends at its next step

A job has no cells: each rank's profiler starts at the end of the optimizer step it is in when
asked, and stops at the end of its last step (`distnb.rank.profiling`, run by the rank's agent on
its main thread), so every step profiled is whole. The report waits while the ranks go on
stepping; a rank that takes no step for `STALLED_S` (hung, stopped, or past its training loop)
is named, and the profiles already in are kept for the next `profile_report()`. The ranks'
collectives come from their agents' tapes, on the clock the profiles are mapped onto; ranks on
one host share that clock.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from distnb.errors import ConfigError
from distnb.ranklist import format_ranks
from distnb.records.agent import Profile, ProfileReport
from distnb.records.collective import CollectiveEvent
from distnb.records.profiling import Profiled, RankProfile
from distnb.session.load import stretched

if TYPE_CHECKING:
    from distnb.ranklist import RankArg
    from distnb.session.attach.surface import JobSurface
    from distnb.views.profiling import ProfileView

__all__ = ["STALLED_S", "profile", "profile_report"]

STALLED_S = 30.0  # a report names the ranks that took no step for this long (busy: longer)
_POLL_S = 0.1


def profile(job: JobSurface, steps: int | None = None, ranks: RankArg | None = None) -> None:
    """Profile the next `steps` optimizer steps of every rank (or the listed ones), from the end
    of the step each is in; None: until `profile_report()`. Asking again starts over."""
    if steps is not None and (isinstance(steps, bool) or steps < 1):
        raise ConfigError(f"steps is how many optimizer steps to profile, 1 or more; got {steps}")
    chosen = job.pick(ranks)
    job._ask(Profile(steps), chosen)
    job.profiling, job.profiled = chosen, {}


def profile_report(job: JobSurface) -> ProfileView:
    """Every profiled rank's steps by phase, the straggler and its cause, once each rank's
    profile has stopped (a profile asked without a step count ends at each rank's next step)."""
    from distnb.views.profiling import ProfileView

    if not job.profiling:
        raise ConfigError(
            "nothing is being profiled on the attached job: %dist_attach --profile N profiles "
            "its next N optimizer steps (%dist_profile --steps N, then %dist_profile --report)"
        )
    profiles = _collect(job)
    job.profiling, job.profiled = [], {}
    began = {p.rank: p.windows[0][0] for p in profiles if p.windows}
    events = [  # from the window's start, a step's end: each rank's calls of the steps profiled
        e
        for rank, found in job.events().items()
        for e, _ in found
        if rank in began and e.arrive_ns >= began[rank]
    ]
    infos = {r: job.link.registered(r) for r in began}
    hosts = {info.host if info is not None else f"rank {r}" for r, info in infos.items()}
    return ProfileView(profiles, aligned(events, one_clock=len(hosts) == 1))


def aligned(events: Sequence[CollectiveEvent], one_clock: bool) -> list[CollectiveEvent]:
    """`events` with each call's start where its last member arrived and its end where its
    first member saw it complete, as distnb's own ranks record them. An agent does not exchange
    with its peers, so it notes only its arrival, and its work's end as the backend reports it,
    which can come late (a rank busy when the backend's thread finishes): the members of one
    collective end together. Only where the ranks share one clock (one host); else the wait is
    left in the collective's time."""
    if not one_clock:
        return list(events)
    last_in: dict[tuple[str, int], int] = {}
    first_out: dict[tuple[str, int], int] = {}
    for e in events:
        key = (e.group, e.seq)
        last_in[key] = max(last_in.get(key, 0), e.arrive_ns)
        if e.end_ns:
            first_out[key] = min(first_out.get(key, e.end_ns), e.end_ns)
    out = []
    for e in events:
        key = (e.group, e.seq)
        start = max(e.start_ns, last_in[key])
        end = max(start, first_out[key]) if e.end_ns else 0
        out.append(replace(e, start_ns=start, end_ns=end))
    return out


def _collect(job: JobSurface) -> list[RankProfile]:
    """Each profiled rank's profile, asking until every one has stopped (see the module)."""
    steps: dict[int, int] = {}
    moved = time.monotonic()
    while True:
        waiting = [r for r in job.profiling if r not in job.profiled]
        if not waiting:
            return [job.profiled[r] for r in job.profiling]
        replies = job._ask(ProfileReport(end=True), waiting)
        said = {r: Profiled.from_dict(rep.value) for r, rep in replies.items() if rep.value}
        lost = [r for r in waiting if r in replies and not (r in said and said[r].asked)]
        if lost:
            job.profiling = [r for r in job.profiling if r not in lost]
            raise ConfigError(
                f"{format_ranks(lost)} {'has' if len(lost) == 1 else 'have'} no profile under "
                "way (a detach dropped it, or the rank started again): %dist_attach --profile N "
                "asks again"
            )
        for rank, found in said.items():
            if found.profile is not None:
                job.profiled[rank] = found.profile
            if found.profile is not None or steps.get(rank) != found.steps:
                steps[rank] = found.steps
                moved = time.monotonic()
        if time.monotonic() - moved > stretched(STALLED_S, 4 * STALLED_S):
            left = [r for r in job.profiling if r not in job.profiled]
            raise ConfigError(
                f"{format_ranks(left)} took no optimizer step in {STALLED_S:.0f} s "
                f"({', '.join(f'rank {r}: {steps.get(r, 0)} steps profiled' for r in left)}): "
                "%dist_attach shows where they are; %dist_profile --report collects the profile "
                "once they step again"
            )
        time.sleep(_POLL_S)
