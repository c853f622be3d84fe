"""The reset: the state a fresh worker has, captured when the rank joins (`remember`), set for
each run and the cells' put back after it (`as_fresh`), dropped when the rank leaves (`forget`).

The rank's joined state is held here (`_joined`), one per process.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from distnb import interrupts
from distnb.rank.fresh import interpreter, torchstate
from distnb.rank.fresh.modules import ModulesPart
from distnb.rank.fresh.notebook import NotebookPart
from distnb.rank.fresh.patches import PatchesPart
from distnb.rank.fresh.switches import SwitchesPart

__all__ = ["as_fresh", "forget", "remember"]


class Part(Protocol):
    """One piece of process state: captured, made fresh for a run, put back after it."""

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
_running = False  # inside `as_fresh`: a run's code runs


def remember() -> None:
    """Capture the state a fresh worker has: call once the rank has joined (torchrun's
    environment set, torch and the process group ready), before any cell runs."""
    global _joined
    _joined = [(part, part.capture()) for part in PARTS]
    _modules.joined(dict(_joined)[_modules])


def forget() -> None:
    """The rank leaves the session: nothing to reset to any more."""
    global _joined
    _joined = None


@contextmanager
def as_fresh() -> Iterator[None]:
    """Inside the block the process looks as it did when the rank joined; the state before
    the block (the cells') is back after it, whatever the block did."""
    if _joined is None:  # not a rank (a test, plain Python): nothing was remembered
        yield
        return
    global _running
    saved: list[tuple[Part, Any]] = []
    try:
        with interrupts.held() as noted:  # a reset cut half-way mixes the run's and the cells'
            saved = [(part, part.capture()) for part in PARTS]
            for part, joined in _joined:
                part.fresh(joined)
        noted.check()
        _running = True
        yield
    finally:
        _running = False
        with interrupts.held() as noted:
            _put_back(saved)
        noted.check()


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
