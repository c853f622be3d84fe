"""`Session.diff`: do the ranks hold what their replicas hold?

Each rank digests the tensors named (`distnb.rank.replicas`) and sends the digests back through
the session, never through the user's process group (their collective sequence is untouched).
The kernel compares each replica group's digests; only tensors whose digests differ move, from
one rank of each disagreeing group, to size the difference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from distnb.errors import ConfigError, RankError
from distnb.ranklist import format_ranks
from distnb.records.replicas import Difference, ReplicaReport, compare

if TYPE_CHECKING:
    from distnb.session import Session
    from distnb.views.replicas import ReplicaView, WatchView

__all__ = ["diff", "diff_report", "diff_stop", "diff_watch"]


def diff(
    session: Session,
    *names: str,
    grads: bool = False,
    buffers: bool = False,
    atol: float = 0.0,
    expect: str = "same",
    ranks: list[int] | None = None,
) -> ReplicaView:
    """Compare `names` (modules, tensors, optimizers, dicts and lists of them) across the ranks
    that should hold them identically; with `grads`/`buffers`, modules' gradients and buffers
    too. Differences up to `atol` count as agreement. `expect="differ"` flags what is identical
    where it should differ by rank (each rank's batch).

    >>> s.diff("model", "opt", grads=True)      # %dist_diff model opt --grads
    replicas differ: 1 of 14 ...
    """
    from distnb.rank import replicas
    from distnb.views.replicas import ReplicaView

    if not names:
        raise ConfigError("name what to compare: %dist_diff model [opt ...]")
    if expect not in ("same", "differ"):
        raise ConfigError(f"--expect is 'same' or 'differ', not {expect!r}")
    if atol < 0:
        raise ConfigError(f"--atol is a tolerance of 0 or more, not {atol}")
    spec = (list(names), grads, buffers)
    try:
        per_rank = session.call(replicas.digests, *spec, ranks=ranks)
    except RankError as err:  # a name a rank lacks, an object it cannot compare
        failed = format_ranks(f.rank for f in err.failures)
        raise ConfigError(f"{err.failures[0].evalue} ({failed})") from None
    digests = [d for found in per_rank for d in found]
    targets = sorted(ranks) if ranks is not None else [r.rank for r in session.ranks]
    differences, missing, compared, alone = compare(digests, targets, expect)
    sized = [_size(session, spec, d, digests) if expect == "same" else d for d in differences]
    kept = tuple(d for d in sized if d.max_abs is None or d.max_abs > atol)
    nbytes = sum(d.nbytes for d in digests)
    return ReplicaView(
        ReplicaReport(tuple(names), tuple(targets), compared, nbytes, kept, tuple(missing), alone),
        expect,
        within_atol=len(sized) - len(kept),
    )


def diff_watch(session: Session, name: str, every: int = 1, optim: str | None = None) -> None:
    """Record the digests of module `name` (and optimizer `optim`'s state) on every rank every
    `every` steps: before each forward, or after each `optim.step()` when given. Nothing moves
    between ranks while they train; `diff_report` finds the first step that differed.

    >>> s.diff_watch("model", optim="opt")      # %dist_diff model --watch --optim opt
    """
    from distnb.rank.replicas import watch

    if every < 1:
        raise ConfigError(f"--every is a number of steps, 1 or more, not {every}")
    try:
        session.call(watch.start, name, every, optim)
    except RankError as err:
        raise ConfigError(f"{err.failures[0].evalue}") from None


def diff_report(session: Session, name: str) -> WatchView:
    """The first step at which the watched replicas of `name` differed, and what differed."""
    from distnb.rank.replicas import watch
    from distnb.records.replicas import first_divergence
    from distnb.views.replicas import WatchView

    try:
        history = session.call(watch.history, name)
    except RankError as err:
        raise ConfigError(f"{err.failures[0].evalue}") from None
    return WatchView(first_divergence(name, [r.rank for r in session.ranks], history))


def diff_stop(session: Session, name: str) -> None:
    """Remove the watch on `name` from every rank."""
    from distnb.rank.replicas import watch

    if not any(session.call(watch.stop, name)):
        raise ConfigError(f"nothing watches {name!r}: %dist_diff {name} --watch starts a watch")


def _size(
    session: Session, spec: tuple[list[str], bool, bool], d: Difference, digests: Sequence[Any]
) -> Difference:
    """The largest difference between the first group of agreeing ranks and the others."""
    import torch

    from distnb.rank import replicas

    if d.values:  # a plain value: the values are the answer
        return d
    firsts = [group[0] for group in d.agree]
    got = session.call(replicas.tensor_values, *spec, [d.name], ranks=firsts)
    tensors = [found.get(d.name) for found in got]
    ref = tensors[0]
    best: tuple[float, float, tuple[int, ...]] = (-1.0, 0.0, ())
    for other in tensors[1:]:
        if ref is None or other is None or ref.shape != other.shape:
            return d  # shapes differ: the table says so
        a, b = ref.double(), other.double()
        gap = (a - b).abs()
        nan = torch.isnan(a) ^ torch.isnan(b)
        gap = torch.where(nan, torch.full_like(gap, float("inf")), torch.nan_to_num(gap, nan=0.0))
        if gap.numel() == 0:
            continue
        flat = int(gap.argmax())
        at = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), gap.shape))
        abs_gap = float(gap.reshape(-1)[flat])
        rel = abs_gap / max(abs(float(a.reshape(-1)[flat])), 1e-30)
        if abs_gap > best[0]:
            best = (abs_gap, rel, at)
    if best[0] < 0:
        return d
    return replace(d, max_abs=best[0], max_rel=best[1], index=best[2])
