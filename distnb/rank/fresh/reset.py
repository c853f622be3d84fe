"""The reset: the state a fresh worker has, captured when the rank joins (`remember`), set for
each run and the cells' put back after it (`as_fresh`), dropped when the rank leaves (`forget`).
A run's state part way, set aside (`set_aside`), is where a later run may start instead
(`as_fresh(made)`): a script's imports made ahead (`distnb.rank.ahead`).

The rank's joined state is held here (`_joined`), one per process.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple, Protocol

from distnb import interrupts
from distnb.rank.fresh import interpreter, torchstate
from distnb.rank.fresh.hooks import Aside
from distnb.rank.fresh.modules import ModulesPart
from distnb.rank.fresh.notebook import NotebookPart
from distnb.rank.fresh.patches import PatchesPart
from distnb.rank.fresh.switches import SwitchesPart

__all__ = [
    "Made",
    "as_fresh",
    "end_aside",
    "forget",
    "joins",
    "remember",
    "remembered",
    "running",
    "set_aside",
    "unchanged",
]


class Made(NamedTuple):
    """A run's state set aside part way (`set_aside`), for a later run to start from."""

    state: list[tuple[Part, Any]]  # each part's capture
    hooks: Aside  # the run's `atexit` and fork handlers
    join: int  # the join it was made under (`joins`)

    def modules(self) -> dict[str, Any]:
        """`sys.modules` as the run had it."""
        modules: dict[str, Any] = dict(self.state)[_modules]
        return modules


class Part(Protocol):
    """One piece of process state: captured, made fresh for a run, put back after it.

    `fresh(value)` sets the state to `value` (a capture), but in parts with `carried = False`,
    whose run starts from the cells' (builtins) or from what the process has (its groups):
    those a run set aside must not have changed."""

    name: str

    def capture(self) -> Any: ...

    def fresh(self, joined: Any) -> None: ...

    def restore(self, saved: Any) -> None: ...


_modules = ModulesPart()
# Patches before modules: a run's end judges its patches once its modules have ended (their
# `atexit` handlers run with them in place, what a compiled package is known). Modules before the
# rest: those parts may import (numpy's generator, torch's config modules).
PARTS: tuple[Part, ...] = (
    PatchesPart(_modules.kept),
    _modules,
    *interpreter.PARTS,
    NotebookPart(),
    SwitchesPart(),
    *torchstate.PARTS,
)
_joined: list[tuple[Part, Any]] | None = None
_joins = 0  # joins so far: what a run set aside is for the join it was made under
_running = False  # inside `as_fresh`: a run's code runs


def remember() -> None:
    """Capture the state a fresh worker has: call once the rank has joined (torchrun's
    environment set, torch and the process group ready), before any cell runs."""
    global _joined, _joins
    _joined = [(part, part.capture()) for part in PARTS]
    _joins += 1
    _modules.joined(dict(_joined)[_modules])


def forget() -> None:
    """The rank leaves the session: nothing to reset to any more."""
    global _joined
    _joined = None


def remembered() -> bool:
    """Whether the process is a rank's, its join remembered (`remember`)."""
    return _joined is not None


def joins() -> int:
    """How many times the rank joined: a `Made` of another join is no run's start."""
    return _joins


@contextmanager
def as_fresh(made: Made | None = None) -> Iterator[None]:
    """Inside the block the process looks as it did when the rank joined, or as `made` left
    it; the state before the block (the cells') is back after it, whatever the block did."""
    if _joined is None:  # not a rank (a test, plain Python): nothing was remembered
        yield
        return
    global _running
    saved: list[tuple[Part, Any]] = []
    try:
        with interrupts.held() as noted:  # a reset cut half-way mixes the run's and the cells'
            saved = [(part, part.capture()) for part in PARTS]
            for part, value in _joined if made is None else made.state:
                if part is _modules:
                    _modules.fresh(value, None if made is None else made.hooks)
                else:
                    part.fresh(value)
        noted.check()
        _running = True
        yield
    finally:
        _running = False
        with interrupts.held() as noted:
            _put_back(saved)
        noted.check()


def unchanged() -> list[tuple[Part, Any]]:
    """The parts a run's state set aside must leave as they are (`Part`), captured: at the
    start of the code whose end is set aside."""
    return [(part, part.capture()) for part in PARTS if not getattr(part, "carried", True)]


def set_aside(before: Sequence[tuple[Part, Any]]) -> Made | None:
    """Inside `as_fresh`: the run's state so far, for a later run to start from (its end then
    leaves the run's modules and hooks); None, and nothing set aside, where the code since
    `before` (`unchanged()`) changed a part a run cannot carry."""
    if _joined is None or any(not _same(value, part.capture()) for part, value in before):
        return None
    state = [(part, part.capture()) for part in PARTS]
    return Made(state, _modules.set_aside(), _joins)


def end_aside(made: Made) -> None:
    """`made` starts no run: its modules' `atexit` handlers run, as at a worker's end."""
    _modules.end_aside(dict(made.state)[_modules], made.hooks)


def _same(a: Any, b: Any) -> bool:
    """`a` and `b` hold the same objects (captures: dicts, lists, tuples of them)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(v, b[k]) for k, v in a.items())
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a is b or (type(a) in (int, float, str, bool) and a == b)


def running() -> bool:
    """Whether a run's code runs now (inside `as_fresh`), not a cell's."""
    return _running


def _put_back(saved: Sequence[tuple[Part, Any]]) -> None:
    """Restore every part, the last made fresh first; a part that fails is named and the
    others are restored all the same."""
    for part, value in reversed(saved):
        try:
            part.restore(value)
        except Exception as exc:
            print(
                f"distnb: after the run, the rank's {part.name} could not be put back as the "
                f"cells had them ({type(exc).__name__}: {exc}); run %dist_restart if cells "
                "misbehave",
                file=sys.stderr,
            )
