"""Watching replicas over training: the digests of a module's parameters (and an optimizer's
state) every N-th step, kept on the rank, so the kernel can say at which step replicas first
stopped agreeing.

A step is a call of the module's forward (the digests are taken before it), or, when an
optimizer is given, a call of its `step` (after it). A watch never waits for a peer and never
meets the user's collectives: each rank records, and the kernel reads every rank's record when
asked (`history`). With `raise_`, each rank also posts each record to a board in the control
plane's store and compares the peers' records that are there already (`_Alarm`): of two ranks,
the later to reach a step sees both, and raises `ReplicasDivergedError` in that step.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from distnb import interrupts
from distnb.contract import keys
from distnb.errors import ReplicasDivergedError
from distnb.rank.checked import exchange
from distnb.rank.replicas.digest import digests
from distnb.records.codec import dumps_many, loads_many
from distnb.records.replicas import Difference, Digest, compare

__all__ = ["MAX_STEPS", "history", "start", "stop", "watching"]

MAX_STEPS = 10_000  # steps recorded per watch; later ones are counted, not recorded
_DEPTH = 64  # records a board keeps per rank: a peer further behind is not compared


class _Alarm:
    """Compares this rank's records with its peers' as they arrive; never waits for one."""

    def __init__(self, name: str) -> None:
        from distnb.rank.runtime import control_store

        global _boards
        _boards += 1  # every rank starts its watches together: the same board name everywhere
        self.name = name
        self.board = exchange.StoreBoard(control_store(), keys.replicas(f"watch/{_boards}"), _DEPTH)
        self.rank = dist.get_rank()
        self.peers = [r for r in range(dist.get_world_size()) if r != self.rank]
        self.next = dict.fromkeys(self.peers, 1)  # per peer: the next record to compare
        self.mine: dict[int, tuple[int, list[Digest]]] = {}  # recent (step, record), by stamp

    def check(self, stamp: int, step: int, found: list[Digest]) -> None:
        self.board.post(self.rank, stamp, dumps_many(found))
        self.mine[stamp] = step, found
        for peer in self.peers:
            while self.next[peer] <= stamp:
                at = self.next[peer]
                payload = self.board.read(peer, at)
                if payload is None:
                    break  # the peer has not got there yet: it will compare
                self.next[peer] += 1
                if payload is exchange.LAPPED or at not in self.mine:
                    continue
                then, ours = self.mine[at]
                differences, _, _, _ = compare(
                    ours + loads_many(Digest, payload), (self.rank, peer)
                )
                if differences:
                    raise ReplicasDivergedError(_diverged(self.name, then, step, differences))
        oldest = min(self.next.values(), default=stamp + 1)
        for old in [s for s in self.mine if s < oldest]:
            del self.mine[old]


def _diverged(name: str, then: int, now: int, differences: list[Difference]) -> str:
    when = f"step {then}" + (f" (seen at step {now})" if now != then else "")
    what = "; ".join(f"{d.name} ({d.groups})" for d in differences[:5])
    more = f" and {len(differences) - 5} more" if len(differences) > 5 else ""
    return (
        f"replicas of {name} differ at {when}: {what}{more}. %dist_diff {name} --report names "
        f"the first step; %dist_diff {name} --stop ends the watch"
    )


class _Watch:
    def __init__(self, names: list[str], every: int, alarm: _Alarm | None) -> None:
        self.names = names
        self.every = every
        self.step = 0
        self.steps: list[tuple[int, list[Digest]]] = []
        self.handle: Any = None
        self.alarm = alarm

    def take(self) -> None:
        self.step += 1
        if (self.step - 1) % self.every or len(self.steps) >= MAX_STEPS:
            return
        with torch.no_grad():
            found = digests(self.names, False, False)
        self.steps.append((self.step, found))
        if self.alarm is not None:
            try:
                self.alarm.check(len(self.steps), self.step, found)
            except ReplicasDivergedError:
                self.alarm = None  # said once; the record goes on
                raise


_watches: dict[str, _Watch] = {}
_boards = 0


def start(name: str, every: int = 1, optim: str | None = None, raise_: bool = False) -> None:
    """Watch `name` (a module on this rank) every `every` steps; `optim` names its optimizer,
    whose state is watched too and whose `step` counts the steps. `raise_`: raise
    `ReplicasDivergedError` in the step where a rank sees replicas differ."""
    from distnb.rank.runtime import _lookup

    stop(name)
    module = _lookup(name)
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"{name} is a {type(module).__name__}: --watch watches a module")
    watch = _Watch([name] + ([optim] if optim else []), every, _Alarm(name) if raise_ else None)
    optimizer = _lookup(optim) if optim is not None else None
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"{optim} is a {type(optimizer).__name__}, not an optimizer")
    with interrupts.held() as noted:  # the hook and its record together, or neither
        if optimizer is not None:
            watch.handle = optimizer.register_step_post_hook(lambda *_: watch.take())
        else:
            watch.handle = module.register_forward_pre_hook(lambda *_: watch.take())
        _watches[name] = watch
    noted.check()


def stop(name: str) -> bool:
    watch = _watches.pop(name, None)
    if watch is not None:
        watch.handle.remove()
    return watch is not None


def watching() -> list[str]:
    return sorted(_watches)


def history(name: str) -> list[tuple[int, list[Digest]]]:
    """What the watch on `name` recorded: (step, digests) in order."""
    if name not in _watches:
        raise NameError(f"nothing watches {name!r} on this rank: %dist_diff {name} --watch first")
    return list(_watches[name].steps)
