"""`Session.diff`: do the ranks hold what their replicas hold?

The ranks check together (`distnb.rank.replicas.check`, which scripts call as
`distnb.diff_replicas`): digests go through the control plane, never the user's process group,
and only tensors whose digests differ move. A watch records digests on each rank as training
runs (`distnb.rank.replicas.watch`); the kernel finds the first step that differed.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from distnb.errors import CallInterrupted, ConfigError, Interrupted, RankError
from distnb.ranklist import RankArg, format_ranks
from distnb.records.replicas import bad_options

if TYPE_CHECKING:
    from distnb.session.surface import SessionSurface
    from distnb.views.replicas import ReplicaView, WatchView

__all__ = ["diff", "diff_report", "diff_stop", "diff_watch"]

_UNDO_S = 30.0  # removing a watch cut half-way: a rank that takes longer is stuck


def diff(
    session: SessionSurface,
    *names: str,
    grads: bool = False,
    buffers: bool = False,
    atol: float = 0.0,
    expect: str = "same",
    ranks: RankArg | None = None,
) -> ReplicaView:
    """Compare `names` (modules, tensors, optimizers, dicts and lists of them) across the ranks
    that should hold them identically; with `grads`/`buffers`, modules' gradients and buffers
    too. Differences up to `atol` count as agreement. `expect="differ"` flags what is identical
    where it should differ by rank (each rank's batch). On a rank, `distnb.diff_replicas` gives
    the same record.

    >>> s.diff("model", "opt", grads=True)      # %dist_diff model opt --grads
    replicas differ: 1 of 14 ...
    """
    from distnb.rank.replicas.check import diff_replicas
    from distnb.views.replicas import ReplicaView

    if not names:
        raise ConfigError("name what to compare: %dist_diff model [opt ...]")
    if bad := bad_options(atol, expect):
        raise ConfigError(f"--{bad}")
    session.require_running(notice=True)  # before `targets`, which reads the running ranks
    targets = [t.rank for t in session.targets(ranks)] if ranks is not None else None
    check = partial(
        diff_replicas, grads=grads, buffers=buffers, atol=atol, expect=expect, ranks=targets
    )
    try:
        reports = session.call(check, *names, ranks=targets)
    except RankError as err:  # a name a rank lacks, an object it cannot compare
        failed = format_ranks(f.rank for f in err.failures)
        raise ConfigError(f"{err.failures[0].evalue} ({failed})") from None
    return ReplicaView(reports[0])


def diff_watch(
    session: SessionSurface,
    name: str,
    every: int = 1,
    optim: str | None = None,
    raise_: bool = False,
) -> None:
    """Record the digests of module `name` (and optimizer `optim`'s state) on every rank every
    `every` steps: before each forward, or after each `optim.step()` when given. Nothing is
    waited for while ranks train; `diff_report` finds the first step that differed. `raise_`:
    a rank that sees replicas differ raises `ReplicasDivergedError` in that step.

    >>> s.diff_watch("model", optim="opt")      # %dist_diff model --watch --optim opt
    """
    from distnb.rank.replicas import watch

    if every < 1:
        raise ConfigError(f"--every is a number of steps, 1 or more, not {every}")
    try:
        session.call(watch.start, name, every, optim, raise_)
    except RankError as err:
        raise ConfigError(f"{err.failures[0].evalue}") from None
    except CallInterrupted:  # a watch on some ranks only would report a false divergence
        try:
            session.call(watch.stop, name, timeout=_UNDO_S)
        except (CallInterrupted, RankError):
            state = f"it may watch on some ranks: %dist_diff {name} --stop removes it"
        else:
            state = f"no rank watches {name}; run it again"
        raise Interrupted(f"%dist_diff --watch was interrupted: {state}") from None


def diff_report(session: SessionSurface, name: str) -> WatchView:
    """The first step at which the watched replicas of `name` differed, and what differed."""
    from distnb.rank.replicas import watch
    from distnb.records.replicas import first_divergence
    from distnb.views.replicas import WatchView

    try:
        history = session.call(watch.history, name)
    except RankError as err:
        raise ConfigError(f"{err.failures[0].evalue}") from None
    return WatchView(first_divergence(name, [r.rank for r in session.ranks], history))


def diff_stop(session: SessionSurface, name: str) -> None:
    """Remove the watch on `name` from every rank."""
    from distnb.rank.replicas import watch

    if not any(session.call(watch.stop, name)):
        raise ConfigError(f"nothing watches {name!r}: %dist_diff {name} --watch starts a watch")
