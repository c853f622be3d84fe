"""Every way into a debugger on a rank, routed to the notebook: `breakpoint()`, pdb, `input()`
and post-mortem.

`install` (at rank start) points every way into a debugger at `RankPdb`, whose prompt is asked
in the notebook through the kernel (`distnb.rank.debug.ask`):

- `breakpoint()` (`sys.breakpointhook`), `pdb.set_trace()`, `pdb.Pdb()` and IPython's debugger
  class on the engine (so `ipdb.set_trace()` and `%debug` too);
- `torch.distributed.breakpoint(rank=N)`: rank N stops at the caller's line *before* the
  barrier, so the other ranks wait at the barrier for it (checked: without a timeout), and
  stepping on starts after the barrier, never inside it;
- `input()` and `getpass.getpass()`: the engine kernel's `raw_input` and `getpass`, which
  ipykernel makes `input` and `getpass.getpass` during each cell (a password is asked with the
  frontend's hidden input).

Each cell's start says whether the kernel's frontend can answer (`begin_run`); where it cannot
(nbconvert, papermill), a breakpoint is skipped with one line saying so. The exception a cell
ends with is kept (`end_run`) until the next cell, for `post_mortem`.
"""

from __future__ import annotations

import bdb
import pdb
import sys
from types import FrameType
from typing import Any

from distnb.rank.debug import visual
from distnb.rank.debug.ask import Asker, NoInput
from distnb.rank.debug.debugger import CellOf, RankPdb, site
from distnb.records.debug import AskKind

__all__ = [
    "Pdb",
    "ask_input",
    "ask_password",
    "begin_run",
    "breakpointhook",
    "dist_breakpoint",
    "end_run",
    "install",
    "post_mortem",
    "set_trace",
    "uninstall",
]


class _State:
    def __init__(self, asker: Asker, cell_of: CellOf, shell: Any) -> None:
        self.asker = asker
        self.cell_of = cell_of
        self.shell = shell
        self.failure: BaseException | None = None  # the last cell's exception
        self.in_post_mortem = False
        self.everyone = True  # every rank runs the current cell
        self.saved: list[tuple[Any, str, Any]] = []  # (object, attribute, value before)

    def patch(self, obj: Any, name: str, value: Any) -> None:
        self.saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)


_state: _State | None = None


class Pdb(RankPdb):
    """`pdb.Pdb` on a rank: takes pdb's (and IPython's, ipdb's) arguments, asks in the notebook."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        assert _state is not None, "distnb's debugger is installed on ranks only"
        super().__init__(_state.asker, _state.cell_of)

    def set_trace(self, frame: FrameType | None = None) -> None:
        frame = frame or sys._getframe(1)
        if not _skipped(frame):
            super().set_trace(frame)


def install(store: Any, rank: int, cell_of: CellOf, shell: Any = None) -> None:
    """Route this rank's debuggers and `input()` to the kernel's user (see the docstring)."""
    global _state
    import IPython.core.debugger as ipython_debugger
    import torch.distributed as dist

    uninstall()
    _state = state = _State(Asker(store, rank), cell_of, shell)
    state.patch(sys, "breakpointhook", breakpointhook)
    state.patch(pdb, "set_trace", set_trace)
    state.patch(pdb, "Pdb", Pdb)
    state.patch(dist, "breakpoint", dist_breakpoint)
    # What IPython (and ipdb, and `%debug`) build on an engine: a class attribute on IPython 8,
    # a property that looks this name up on IPython 9.
    for name in ("Pdb", "InterruptiblePdb"):
        if hasattr(ipython_debugger, name):
            state.patch(ipython_debugger, name, Pdb)
    kernel = getattr(shell, "kernel", None)
    if kernel is not None:  # ipykernel makes `input` its `raw_input` for each cell
        state.patch(kernel, "raw_input", ask_input)
        state.patch(kernel, "getpass", ask_password)


def uninstall() -> None:
    global _state
    if _state is None:
        return
    for obj, name, value in reversed(_state.saved):
        setattr(obj, name, value)
    _state = None


def begin_run(run_id: int, stdin: bool, everyone: bool = True) -> None:
    """A cell starts: `stdin` says whether the kernel's frontend can answer prompts, `everyone`
    whether every rank runs it."""
    if _state is not None:
        _state.asker.begin_run(run_id, stdin)
        _state.everyone = everyone
        visual.name_cell(_state.shell, _state.asker.store)
        visual.trace_cells()


def end_run(error: BaseException | None) -> None:
    """A cell ended, with `error` if it raised: kept for `post_mortem` until the next cell."""
    if isinstance(getattr(sys.gettrace(), "__self__", None), RankPdb):
        sys.settrace(None)  # a debugger still stepping when the cell ended: the cell is over
    if _state is None:
        return
    if _state.in_post_mortem:
        _state.in_post_mortem = False
        return
    _state.failure = error


def ask_input(prompt: str = "") -> str:
    """`input()` on a rank: the line the user types in the notebook."""
    return _ask(str(prompt), AskKind.INPUT, sys._getframe(1))


def ask_password(prompt: str = "Password: ", stream: Any = None, **kwargs: Any) -> str:
    """`getpass.getpass()` on a rank: typed in the notebook, hidden as it is typed."""
    return _ask(str(prompt), AskKind.PASSWORD, sys._getframe(1))


def _ask(prompt: str, kind: AskKind, frame: FrameType) -> str:
    assert _state is not None
    try:
        return _state.asker.ask(prompt, site(frame, frame.f_lineno, _state.cell_of), kind)
    except NoInput as exc:
        raise EOFError(str(exc)) from None


def set_trace(frame: FrameType | None = None, *, header: str | None = None) -> None:
    """`pdb.set_trace()` on a rank: stop at the caller's next line."""
    debugger = Pdb()
    if header is not None:
        debugger.message(header)
    debugger.set_trace(frame or sys._getframe(1))


def breakpointhook(*args: Any, **kwargs: Any) -> None:
    """`breakpoint()` on a rank: JupyterLab's visual debugger where it is attached, else pdb."""
    if visual.connected():
        visual.stop_here(sys._getframe(1))
    else:
        set_trace(sys._getframe(1))


def dist_breakpoint(rank: int = 0, timeout_s: int = 3600) -> None:
    """`torch.distributed.breakpoint` on distnb's ranks: rank `rank` stops at the caller's
    line while the others wait for it at a barrier (`timeout_s` is not needed: a checked
    barrier waits for a stopped rank as long as it takes). In a cell that only some ranks run
    (`--ranks`) there are no others to hold: no barrier."""
    import torch.distributed as dist

    caller = sys._getframe(1)
    debugger = None
    if dist.get_rank() == rank and not _skipped(caller):
        debugger = Pdb()
        debugger.reset()
        debugger.interaction(caller, None)
        if debugger.quitting:
            raise debugger.quit_error()
    if _state is None or _state.everyone:
        dist.barrier()
    if debugger is not None and (debugger.stoplineno != -1 or debugger.breaks):
        _trace_from(debugger, caller)  # `n`, `s`, `r` or breakpoints: go on tracing


def post_mortem() -> None:
    """Debug the exception this rank's last cell raised, at its failing frame."""
    assert _state is not None
    failure = _state.failure
    if failure is None:
        raise RuntimeError(f"rank {_state.asker.rank}'s last cell raised nothing to debug")
    _state.in_post_mortem = True
    debugger = Pdb()
    debugger.reset()
    debugger.message(f"{type(failure).__name__}: {failure}")
    debugger.interaction(None, failure.__traceback__)


def _skipped(frame: FrameType) -> bool:
    """No frontend can answer a prompt: say so in one line, and do not stop."""
    assert _state is not None
    if _state.asker.stdin:
        return False
    here = site(frame, frame.f_lineno, _state.cell_of)
    print(_state.asker.no_input(here, AskKind.DEBUGGER), file=sys.stderr)
    return True


def _trace_from(debugger: bdb.Bdb, frame: FrameType) -> None:
    """Trace `frame` and its callers with `debugger`, as `Bdb.set_trace` does, keeping the
    stepping command the user gave."""
    bottom: FrameType | None = frame
    while bottom is not None:
        bottom.f_trace = debugger.trace_dispatch
        debugger.botframe = bottom
        bottom = bottom.f_back
    sys.settrace(debugger.trace_dispatch)
