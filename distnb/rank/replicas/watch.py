"""Watching replicas over training: the digests of a module's parameters (and an optimizer's
state) every N-th step, kept on the rank, so the kernel can say at which step replicas first
stopped agreeing.

A step is a call of the module's forward (the digests are taken before it), or, when an
optimizer is given, a call of its `step` (after it). Nothing is exchanged while training runs:
each rank only records, so a watch never waits for a peer and never meets the user's
collectives; the kernel reads every rank's record when asked (`history`).
"""

from __future__ import annotations

from typing import Any

import torch

from distnb.rank.replicas import digests
from distnb.records.replicas import Digest

__all__ = ["MAX_STEPS", "history", "start", "stop", "watching"]

MAX_STEPS = 10_000  # steps recorded per watch; later ones are counted, not recorded


class _Watch:
    def __init__(self, names: list[str], every: int, optim: str | None) -> None:
        self.names = names
        self.every = every
        self.step = 0
        self.steps: list[tuple[int, list[Digest]]] = []
        self.handle: Any = None

    def take(self) -> None:
        self.step += 1
        if (self.step - 1) % self.every == 0 and len(self.steps) < MAX_STEPS:
            with torch.no_grad():
                self.steps.append((self.step, digests(self.names, False, False)))


_watches: dict[str, _Watch] = {}


def start(name: str, every: int = 1, optim: str | None = None) -> None:
    """Watch `name` (a module on this rank) every `every` steps; `optim` names its optimizer,
    whose state is watched too and whose `step` counts the steps."""
    from distnb.rank.runtime import _lookup

    stop(name)
    module = _lookup(name)
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"{name} is a {type(module).__name__}: --watch watches a module")
    watch = _Watch([name] + ([optim] if optim else []), every, optim)
    if optim is not None:
        optimizer = _lookup(optim)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"{optim} is a {type(optimizer).__name__}, not an optimizer")
        watch.handle = optimizer.register_step_post_hook(lambda *_: watch.take())
    else:
        watch.handle = module.register_forward_pre_hook(lambda *_: watch.take())
    _watches[name] = watch


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
