"""A `%dist_run` sees what a fresh torchrun worker sees; the cells keep what they had.

A torchrun worker is a new process: no library singleton (Accelerate's `PartialState`), module
cache, logging or warnings setup, environment change, random state or torch switch survives
from the run before. A rank's process lives for the whole session, so each piece of that state
is captured when the rank joins (`remember`), set back to it when a run starts, and the cells'
own put back when the run ends (`as_fresh`). Which modules a run imports afresh: `modules`;
the interpreter's state: `interpreter`; torch's switches: `switches`; torch's config modules,
the random generators and process groups: `torchstate`.

Why not a new process per run: the rank's process carries the engine (its output, stdin and
debugger, live stacks, Ctrl-C, death reports) and the checked runtime; a process forked per run
would need every one of them carried across. The reset keeps them as they are, costs
milliseconds (`bench/bench_runs.py`), and states its limits: what it cannot reach is state held
in compiled code loaded before the run (numpy's, tokenizers', torch's C++ registries and
caches), threads and `atexit` handlers a run starts, and files it leaves open.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from distnb.rank.fresh import interpreter, torchstate
from distnb.rank.fresh.modules import ModulesPart
from distnb.rank.fresh.switches import SwitchesPart

__all__ = ["as_fresh", "forget", "remember"]


class Part(Protocol):
    """One piece of process state: captured, made fresh for a run, put back after it."""

    name: str

    def capture(self) -> Any: ...

    def fresh(self, joined: Any) -> None: ...

    def restore(self, saved: Any) -> None: ...


_modules = ModulesPart()
# modules first: the parts after it may import (numpy's generator, torch's config modules)
PARTS: tuple[Part, ...] = (_modules, *interpreter.PARTS, SwitchesPart(), *torchstate.PARTS)
_joined: list[tuple[Part, Any]] | None = None


def remember() -> None:
    """Capture the state a fresh worker has: call once the rank has joined (torchrun's
    environment set, torch and the process group ready), before any cell runs."""
    global _joined
    _joined = [(part, part.capture()) for part in PARTS]
    _modules.joined(_joined[0][1])


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
    saved = [(part, part.capture()) for part in PARTS]
    try:
        for part, joined in _joined:
            part.fresh(joined)
        yield
    finally:
        _put_back(saved)


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
