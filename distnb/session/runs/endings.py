"""The errors that end a run early, built whole: a hang report past the timeout, a death report,
and where ranks stood when the user interrupted."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from distnb import errors
from distnb.ranklist import GROUP_FROM, format_ranks, same_ranks
from distnb.records.cell import RankFailure, RankInfo, RankReport, RankState
from distnb.session.cluster.deaths import death_report, stopped_detail, stopped_message
from distnb.session.cluster.members import Members
from distnb.session.runs.failures import stuck_message
from distnb.session.runs.request import CellRequest
from distnb.session.runs.scripts import user_paths

__all__ = ["died_error", "timeout_error", "where_running"]

NO_STACK = "(no stack: the rank did not answer; it may be blocked in native code holding the GIL)"


def where_running(
    where: str, ranks: Sequence[int], waits: Mapping[int, str], stacks: Mapping[int, str]
) -> str:
    """`cell In[3] interrupted: rank 0 waiting at ...; rank 1 at cell In[3] line 5: ...`."""
    said = [
        (rank, waits.get(rank) or stacks.get(rank, "").split("\n", 1)[0] or "running")
        for rank in ranks
    ]
    # from GROUP_FROM ranks on, ranks that were at the same place share one part
    groups = same_ranks(said) if len(said) >= GROUP_FROM else [([r], w) for r, w in said]
    parts = [f"{format_ranks(group)} {words}" for group, words in groups]
    return f"{where} interrupted: " + "; ".join(parts)


def timeout_error(
    request: CellRequest,
    elapsed: float,
    running: Sequence[RankInfo],
    stopped: Sequence[RankInfo],
    stuck: Sequence[RankInfo],
    stacks: Mapping[int, str],
    waits: Mapping[int, str],
    ended: Mapping[int, str],
) -> errors.RankTimeoutError:
    """The hang report: each rank finished, failed (`ended`: its error, "" if none), stopped
    (SIGSTOP, a debugger), or running with its live stack and what its beacon says."""
    reports = []
    for info in request.targets:
        if info in stopped:
            reports.append(RankReport(info.rank, RankState.RUNNING, *stopped_detail(info)))
        elif info.rank not in ended:
            detail = waits.get(info.rank, "still running")
            stack = stacks.get(info.rank, NO_STACK)
            reports.append(RankReport(info.rank, RankState.RUNNING, detail, stack))
        elif ended[info.rank]:
            reports.append(RankReport(info.rank, RankState.FAILED, ended[info.rank]))
        else:
            reports.append(RankReport(info.rank, RankState.FINISHED))
    message = (
        f"{request.where} still running on {format_ranks(t.rank for t in running)} "
        f"after {elapsed:.1f} s (timeout {request.timeout:g} s). "
    )
    if stopped:
        message += stopped_message(stopped) + " "
    if stuck:
        message += stuck_message(t.rank for t in stuck)
    elif not stopped:
        message += "The running ranks were interrupted; the cluster is ready."
    return errors.RankTimeoutError(message, reports)


def interrupted_by_death(failure: RankFailure, where: str) -> RankFailure:
    """A rank distnb interrupted because a peer died: where it was, as one line (its traceback
    would show distnb's and torch's frames it waited in, not the story)."""
    said = f"distnb interrupted it when a peer died; it was {where}"
    return RankFailure(failure.rank, "KeyboardInterrupt", said, "")


def died_error(
    died: Sequence[RankInfo],
    hows: Mapping[int, str],
    when: str,
    code: str | None,
    members: Members,
    failures: list[RankFailure],
) -> errors.RankDiedError:
    """Each dead rank's report (how and `when` it died, at which line of `code`, its last
    output), with the failures of the others."""
    lines = []
    shown: set[str] = set()  # ranks under mpiexec share its log: shown once, unattributed
    for info in died:
        path = members.log_path(info.pid)
        log = members.log_since_mark(info.pid) if path not in shown else ""
        shared = members.log_shared(info.pid)
        shown.add(path)
        how = hows[info.rank]
        user = user_paths(code) if code is not None else ()
        lines.extend(death_report(info, how, when, log, None if shared else code, shared, user))
        failures.append(RankFailure(info.rank, "RankDied", how, ""))
    message = (
        "\n".join(lines)
        + "\nThe process group lost a member: run %dist_restart (or session.restart())."
    )
    return errors.RankDiedError(message, failures)
