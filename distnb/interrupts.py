"""Ctrl-C taken where the kernel, or a rank, can stop cleanly.

Python raises KeyboardInterrupt at whatever instruction the main thread is on when SIGINT comes
(Ctrl-C in a terminal; Jupyter's interrupt is the same signal; the kernel interrupts a rank so).
Three places make that instruction a bad one:

- inside an import, it leaves the module half initialised in `sys.modules`: every later import
  of it fails until the kernel restarts (torch: "partially initialized module 'torch' has no
  attribute 'autograd'"). The kernel imports torch the first time a session starts, a second
  or more on a busy machine: `import_whole` finishes the import, then raises;
- inside a library's `with lock:` that another thread also takes (ipyparallel's futures and
  threading's events, which the client's I/O thread sets as results come), it can land after
  the lock was taken and before the block began: the lock stays held, the I/O thread blocks on
  it for good, and so does the kernel at its next look at a result. The terminal test's Ctrl-C
  once hung IPython so, with nothing on the screen after `^C`;
- inside a teardown or a reset, it leaves half of it undone: `%dist_stop` (processes left
  running), a rank's reset as a run starts or ends (`distnb.rank.fresh`: the cells left with
  the run's modules).

`held()` notes the signal instead of raising it; the code raises it at a point of its choosing
(`Held.check`), and lets it through as usual where the user may type (`let_through`: a
debugger's prompt reads Ctrl-C as "leave").
"""

from __future__ import annotations

import contextlib
import importlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType, ModuleType
from typing import Any

__all__ = ["Held", "held", "import_whole", "let_through"]


class Held:
    """Interrupts noted while a `held()` block runs."""

    def __init__(self) -> None:
        self.count = 0

    def note(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1

    def check(self) -> None:
        """Raise the KeyboardInterrupt the user asked for, if one came."""
        if self.count:
            self.count = 0
            raise KeyboardInterrupt


# The handlers `held()` replaced, innermost last: `let_through` puts back the outermost one.
_before: list[Any] = []
_open: list[Held] = []  # the `held()` blocks open, innermost last


@contextlib.contextmanager
def held() -> Iterator[Held]:
    """Within the block, SIGINT is noted on the `Held` it yields, not raised (see the module).
    Inside another `held()` block, what was noted passes to that one as the block ends: the
    outermost block decides when to raise. Off the main thread no signal can reach the code:
    nothing changes there."""
    noted = Held()
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return
    _before.append(signal.signal(signal.SIGINT, noted.note))
    _open.append(noted)
    try:
        yield noted
    finally:
        signal.signal(signal.SIGINT, _before.pop())
        _open.pop()
        if _open:
            _open[-1].count += noted.count
            noted.count = 0


@contextlib.contextmanager
def let_through() -> Iterator[None]:
    """Within a `held()` block: SIGINT raises again as usual for this block (a prompt's
    `input()`, which Ctrl-C must end); an interrupt noted before it stays noted."""
    if not _before or threading.current_thread() is not threading.main_thread():
        yield
        return
    outer = _before[0] if _before[0] is not None else signal.default_int_handler
    holder = signal.signal(signal.SIGINT, outer)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, holder)


def import_whole(name: str) -> ModuleType:
    """`importlib.import_module(name)`, with Ctrl-C held until it returns (see the module): the
    start that imports stops, the import stays whole."""
    if name in sys.modules:
        return importlib.import_module(name)  # imported already: nothing to cut
    with held() as noted:
        module = importlib.import_module(name)
    if noted.count:
        raise KeyboardInterrupt(f"interrupted while importing {name} (the import was finished)")
    return module
