"""What ranks send back when things go wrong, translated once into distnb's records and errors.

ipyparallel reports a rank's exception as a `RemoteError` (ename, evalue, traceback text) and a
dead engine as an `EngineError`; `to_failure` turns either into a `RankFailure` record, and
`cell_error` builds the one exception a cell raises from them, whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from distnb import errors
from distnb.judgement.desync import skipped_call
from distnb.ranklist import format_ranks
from distnb.records.beacon import Beacon
from distnb.records.cell import RankFailure
from distnb.records.collective import Mismatch
from distnb.session.runs.request import CellResult

__all__ = [
    "CHECKED_ERRORS",
    "call_error",
    "cell_error",
    "debuggable",
    "engine_died",
    "error_of",
    "only_checked",
    "run_error",
    "stuck_message",
    "to_failure",
]

# The checked runtime's errors, raised on ranks, re-raised in the kernel as themselves.
CHECKED_ERRORS: dict[str, type[errors.RankError]] = {
    "CollectiveMismatchError": errors.CollectiveMismatchError,
    "CollectiveDesyncError": errors.CollectiveDesyncError,
}


def to_failure(rank: int, error: BaseException) -> RankFailure:
    """A rank's exception as it came back from ipyparallel (a `RemoteError`, or any other)."""
    tb = getattr(error, "traceback", None)
    return RankFailure(
        rank,
        getattr(error, "ename", type(error).__name__),
        str(getattr(error, "evalue", error)),
        tb if isinstance(tb, str) else "",
    )


def engine_died(error: BaseException | None) -> bool:
    """ipyparallel's word for an engine that died while it ran the request."""
    return getattr(error, "ename", "") == "EngineError"


def only_checked(failures: Iterable[RankFailure]) -> bool:
    return all(f.ename in CHECKED_ERRORS for f in failures)


def cell_error(
    where: str,
    failures: Sequence[RankFailure],
    mismatch: Mismatch | None = None,
    skipped: str = "",
) -> errors.RankError:
    """The one exception for a failed run (`where`: "cell In[3]", "train.py").

    The checked runtime's errors are raised as themselves when every failing rank raised one,
    with the record (`mismatch`) or the skipped call found afterwards (`skipped`). When a rank
    raised an error of its own, that is the cause (the others' `CollectiveDesyncError`s only
    follow from it), so it comes first.
    """
    if only_checked(failures):
        first = min(failures, key=lambda f: (f.ename != "CollectiveMismatchError", f.rank))
        if first.ename == "CollectiveMismatchError":
            return errors.CollectiveMismatchError(first.evalue, failures, mismatch)
        message = f"{first.evalue}\n{skipped}" if skipped else first.evalue
        return errors.CollectiveDesyncError(message, failures)
    own = [f for f in failures if f.ename not in CHECKED_ERRORS]
    groups = errors.group_failures(own) + errors.group_failures(
        [f for f in failures if f.ename in CHECKED_ERRORS]
    )
    summary = "; ".join(
        f"{format_ranks(r)}: {f.summary}" for r, f in groups[: errors.TRACEBACK_LIMIT]
    )
    more = len(groups) - errors.TRACEBACK_LIMIT
    if more > 0:
        summary += f"; ... {more} more"
    return errors.RankError(f"{where} failed on {summary}", failures)


def run_error(
    where: str,
    result: CellResult,
    call: Callable[..., list[Any]],
    waiting: Sequence[Beacon] = (),
    posted: Callable[[int], Mismatch | None] = lambda run_id: None,
) -> errors.RankError:
    """A failed run's one exception, with what can only be learnt now that every rank is idle:
    the mismatch record the ranks `posted` (`ControlPlane.mismatch`), or which call a rank
    skipped (from the ranks' recorded events, asked with `call` as `Session.call` does, and the
    beacons of those left `waiting`)."""
    from distnb.rank import runtime

    posted_record = posted(result.run_id)  # taken whatever the failures: no key outlives its run
    mismatch: Mismatch | None = None
    skipped = ""
    if only_checked(result.failures):
        kinds = {f.ename for f in result.failures}
        if "CollectiveMismatchError" in kinds:
            mismatch = posted_record
        else:
            run_id = result.run_id
            events = [e for per_rank in call(runtime.events, run_id) for e in per_rank]
            skipped = skipped_call([e for e in events if e.run_id == run_id], waiting)
    return cell_error(where, result.failures, mismatch, skipped)


def debuggable(failures: Iterable[RankFailure]) -> list[int]:
    """The ranks whose failure a debugger can open, the cause first: ranks that raised an error
    of their own, then those released by the checked runtime because of it; a dead rank has no
    traceback left."""
    alive = [f for f in failures if f.ename != "RankDied"]
    own = sorted(f.rank for f in alive if f.ename != "CollectiveDesyncError")
    return own + sorted(f.rank for f in alive if f.rank not in own)


def call_error(name: str, failures: Sequence[RankFailure]) -> errors.RankError:
    """A distnb function called on ranks (`Session.call`) failed on some of them."""
    return errors.RankError(f"{name} failed on {format_ranks(f.rank for f in failures)}", failures)


def stuck_message(ranks: Iterable[int]) -> str:
    return (
        f"{format_ranks(ranks)} did not stop after an interrupt (blocked in native code, e.g. a "
        "collective whose peer is gone): run %dist_restart (or session.restart()) to get a "
        "working cluster."
    )


def error_of(ar: Any) -> BaseException | None:
    """The error of a finished rank's request (`streams.Reply`), or None if it succeeded."""
    try:
        ar.get(timeout=0)
    except Exception as exc:
        return exc
    return None
