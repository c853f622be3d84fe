"""One replica check, made by the ranks together: `diff_replicas` (`distnb.diff_replicas` on a
rank; `Session.diff` calls it on every rank and shows rank 0's answer).

Every rank digests what it was asked about and posts its digests to a board in the control
plane's store, never through the user's process group (their collective sequence is
untouched). Each rank reads every rank's and compares them (`records.replicas.compare`: the same
answer everywhere). Only tensors whose digests differ move: the first rank of each group that
disagrees posts its copy, the lowest rank sizes each difference and posts the sized answer,
which every rank returns. The waits are the checked runtime's where it runs (beacon, abort key,
Ctrl-C), so a rank that never calls is named as it would be at a collective.

Call it on every rank (or every rank in `ranks`) in the same order, as a collective.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from distnb.contract import keys
from distnb.errors import ConfigError
from distnb.rank.checked import exchange
from distnb.rank.replicas.digest import digests_of
from distnb.rank.replicas.entries import entries_of
from distnb.records.codec import dumps_many, loads_many
from distnb.records.replicas import Difference, Digest, ReplicaReport, bad_options, compare

__all__ = ["diff_replicas", "size"]

_DEPTH = 2  # a rank posts check n only after reading every peer's n - 1 (see exchange.py)
_calls = 0  # checks made by this process: the boards' stamps


def diff_replicas(
    *targets: str | Mapping[str, Any],
    grads: bool = False,
    buffers: bool = False,
    atol: float = 0.0,
    expect: str = "same",
    ranks: Sequence[int] | None = None,
) -> ReplicaReport:
    """Compare, across the ranks that should hold them identically, the modules, tensors,
    optimizers and (nested) dicts or lists of them named in `targets`: names in this rank's
    namespace (`"model"`, `"model.fc"`) or `{name: object}` (in a script). `grads`/`buffers`
    add modules' gradients and buffers; differences up to `atol` count as agreement;
    `expect="differ"` flags what is identical where it should differ by rank (each rank's batch).
    Every rank in `ranks` (default: all) calls it alike and gets the same report.

    >>> report = distnb.diff_replicas({"model": model, "opt": opt}, grads=True)
    >>> report.agree, [d.name for d in report.differences]
    (False, ['model.fc.weight'])
    """
    global _calls
    if not targets:
        raise ConfigError("name what to compare: diff_replicas('model', ...) or {name: obj}")
    if bad := bad_options(atol, expect):
        raise ConfigError(bad)
    members = sorted(ranks) if ranks is not None else list(range(dist.get_world_size()))
    _calls += 1
    found = list(entries_of(targets, grads, buffers))
    mine = digests_of(found)
    posted = _post_and_read("digests", members, _calls, dumps_many(mine))
    digests = [d for payload in posted for d in loads_many(Digest, payload)]
    differences, missing, compared, alone = compare(digests, members, expect)
    if expect == "same" and any(not d.values for d in differences):
        differences = _sized(differences, found, members)
    kept = tuple(d for d in differences if d.max_abs is None or d.max_abs > atol)
    names = tuple(t if isinstance(t, str) else ", ".join(t) for t in targets)
    return ReplicaReport(
        names,
        tuple(members),
        compared,
        sum(d.nbytes for d in digests),
        kept,
        tuple(missing),
        alone,
        expect,
        within_atol=len(differences) - len(kept),
    )


def _post_and_read(topic: str, members: Sequence[int], stamp: int, payload: bytes) -> list[bytes]:
    """Post `payload` for this rank and wait for every member's, in `members` order."""
    board = _board(topic, members)
    board.post(members.index(dist.get_rank()), stamp, payload)
    return _collect(board, members, range(len(members)), stamp)


def _sized(
    differences: list[Difference], found: Sequence[Any], members: Sequence[int]
) -> list[Difference]:
    """The differences, sized by the lowest member from the first rank of each agreeing group."""
    me = dist.get_rank()
    mine = {name: obj for name, obj, _ in found if isinstance(obj, torch.Tensor)}
    wanted = {d.name for d in differences if not d.values and me in (g[0] for g in d.agree)}
    values = _post_and_read("values", members, _calls, _save({n: mine[n] for n in wanted}))
    sizer = members[0]
    if me == sizer:
        held = [torch.load(io.BytesIO(v), weights_only=True) for v in values]
        by_rank = dict(zip(members, held, strict=True))
        differences = [
            d if d.values else size(d, [by_rank[g[0]].get(d.name) for g in d.agree])
            for d in differences
        ]
        board = _board("sized", members)
        board.post(0, _calls, dumps_many(differences))
        return differences
    (answer,) = _collect(_board("sized", members), members, [0], _calls)
    return loads_many(Difference, answer)


def size(d: Difference, tensors: Sequence[torch.Tensor | None]) -> Difference:
    """`d` with the largest difference between the first group's tensor and the others' (NaN
    against a number: infinite), its relative size and where; as it was if shapes differ."""
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


_boards: dict[tuple[str, tuple[int, ...]], exchange.StoreBoard] = {}


def _board(topic: str, members: Sequence[int]) -> exchange.StoreBoard:
    from distnb.rank.runtime import control_store

    key = (topic, tuple(members))
    if key not in _boards:
        prefix = keys.replicas(f"{topic}/{'.'.join(map(str, members))}")
        _boards[key] = exchange.StoreBoard(control_store(), prefix, _DEPTH, members)
    return _boards[key]


def _collect(
    board: exchange.StoreBoard, members: Sequence[int], rings: Sequence[int], stamp: int
) -> list[bytes]:
    """Wait for `rings` to hold `stamp`: through the checked runtime's monitor where it runs."""
    from distnb.rank.checked import callsite, installation
    from distnb.rank.checked.monitor import Wait
    from distnb.records.beacon import WaitKind

    checker = installation._checker
    if checker is None:
        return exchange.collect(board, rings, stamp, lambda *_: None)
    where = callsite.lookup()
    wait = Wait(
        WaitKind.COLLECTIVE,
        "distnb.replicas",
        "replica check",
        stamp,
        "diff_replicas",
        where,
        members,
    )
    return checker.wait(board, rings, stamp, wait)


def _save(tensors: dict[str, torch.Tensor]) -> bytes:
    out = io.BytesIO()
    torch.save({name: t.detach().cpu() for name, t in tensors.items()}, out)
    return out.getvalue()
