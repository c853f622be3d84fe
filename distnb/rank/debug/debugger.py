"""pdb on a rank, with its prompt in the notebook.

`RankPdb` is the standard library's `pdb.Pdb` with four changes, so that every pdb command and
habit works as users know it:

- its prompts go to the kernel's user through `Asker` (the rank has no stdin of its own);
- the stack it shows starts at the user's code: the cell (or the `%dist_run` script) and what it
  called, without IPython's, ipyparallel's or distnb's frames, and locations read
  `cell In[5] line 3` instead of `/tmp/ipykernel_*/NNN.py(3)`;
- stepping never stops inside distnb or the engine's machinery (`SKIP`, and distnb's files,
  whose engine module runs as `__main__`: `s` on a `print` goes to the next line, not into
  the engine's output stream), so `n` over a checked collective is one step; IPython runs a
  cell one statement at a time, each its own code object, and stepping past the end of one
  goes on to the cell's next line, not into IPython;
- quitting (`q`, or an interrupt at the prompt) raises `DebuggerQuit`, naming the rank and where,
  instead of a bare `BdbQuit`.
"""

from __future__ import annotations

import bdb
import builtins
import code
import linecache
import os
import pdb
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from distnb.errors import DebuggerQuit
from distnb.rank.debug.ask import Asker, NoInput
from distnb.rank.debug.mesh import coordinates
from distnb.records.collective import CallSite
from distnb.records.debug import AskKind
from distnb.userfiles import is_library, script_paths

__all__ = ["RankPdb", "site", "user_stack"]

CellOf = Callable[[str], "int | None"]
Stack = list[tuple[FrameType, int]]


# A file path, and the line after it if any, as pdb's messages write them.
_PATH = re.compile(r"(/[^\s:()]+\.py)(?::(\d+))?")

# Modules stepping never stops in: distnb's and those that run cells on the engine.
SKIP = ["distnb.*", "IPython.*", "ipykernel.*", "ipyparallel.*"]
# distnb's files, whatever their module is called (the engine's entry point runs as __main__).
_DISTNB = str(Path(__file__).resolve().parents[2]) + os.sep


class RankPdb(pdb.Pdb):
    """The debugger of one rank (see the module's docstring)."""

    def __init__(self, asker: Asker, cell_of: CellOf) -> None:
        super().__init__(skip=SKIP, nosigint=True)
        self.asker = asker
        self.cell_of = cell_of
        self.prompt = "(Pdb) "
        self._quit_at = ""
        self._to_next_statement = False  # a cell's statement ended while stepping

    # --- stepping through a cell's statements ----------------------------------------------

    def _statement(self, frame: FrameType) -> bool:
        """`frame` runs one top-level statement of a cell."""
        return (
            frame.f_code.co_name == "<module>"
            and self.cell_of(frame.f_code.co_filename) is not None
        )

    def user_return(self, frame: FrameType, return_value: Any) -> None:
        if self._statement(frame):  # stop at the cell's next line, if it has one
            self._to_next_statement = True
            self._set_stopinfo(None, None)  # type: ignore[attr-defined]
            return
        super().user_return(frame, return_value)

    def stop_here(self, frame: FrameType) -> bool:
        if self._machinery(frame):
            return False
        if self._to_next_statement:  # only the cell's own code: the cell may be over
            return self.cell_of(frame.f_code.co_filename) is not None
        return bool(super().stop_here(frame))

    def _machinery(self, frame: FrameType | None) -> bool:
        """`frame` runs for distnb or the engine (its own code, or a library it called, as the
        standard library's threading from the engine's output stream), not for the user."""
        while frame is not None:
            name = frame.f_globals.get("__name__") or ""
            if frame.f_code.co_filename.startswith(_DISTNB) or self.is_skipped_module(name):
                return True
            if not _is_library(frame) or self.cell_of(frame.f_code.co_filename) is not None:
                return False  # the user's own code, or a library the user's code called
            frame = frame.f_back
        return False

    def user_call(self, frame: FrameType, argument_list: Any) -> None:
        if not self._to_next_statement:  # else stop at the statement's first line, not its call
            super().user_call(frame, argument_list)

    def user_line(self, frame: FrameType) -> None:
        self._to_next_statement = False
        super().user_line(frame)

    # --- where the user's code is ----------------------------------------------------------

    def get_stack(self, f: FrameType | None, t: TracebackType | None) -> tuple[Stack, int]:
        stack, index = super().get_stack(f, t)
        return user_stack(stack, index, self.cell_of)

    def message(self, msg: str) -> None:
        super().message(_PATH.sub(self._cell_path, msg))

    def error(self, msg: str) -> None:
        super().error(_PATH.sub(self._cell_path, msg))

    def _cell_path(self, match: re.Match[str]) -> str:
        """`/tmp/ipykernel_1/2.py:3` (as `b` reports a breakpoint) -> `cell In[5] line 3`."""
        cell = self.cell_of(match.group(1))
        if cell is None:
            return match.group(0)
        line = f" line {match.group(2)}" if match.group(2) else ""
        return f"cell In[{cell}]{line}"

    def format_stack_entry(self, frame_lineno: tuple[FrameType, int], lprefix: str = ": ") -> str:
        frame, lineno = frame_lineno
        text: str = super().format_stack_entry(frame_lineno, lprefix)
        filename = self.canonic(frame.f_code.co_filename)
        cell = self.cell_of(frame.f_code.co_filename)
        where = f"cell In[{cell}] line {lineno}" if cell is not None else f"{filename}:{lineno}"
        return text.replace(f"{filename}({lineno})", f"{where}, in ", 1)

    # --- the prompt -----------------------------------------------------------------------

    def interaction(self, frame: FrameType | None, tb: TracebackType | None) -> None:
        with _input_from(self._ask):
            super().interaction(frame, tb)

    def _ask(self, prompt: str = "") -> str:
        frame = self.curframe
        here = site(frame, frame.f_lineno, self.cell_of) if frame is not None else None
        return self.asker.ask(prompt, here, AskKind.DEBUGGER, coordinates(frame))

    def cmdloop(self, intro: str | None = None) -> None:
        try:
            super().cmdloop(intro)
        except NoInput as exc:  # nobody can answer: carry on as if there were no breakpoint
            self.message(str(exc))
            self.set_continue()
        except KeyboardInterrupt:  # the user interrupted the kernel at this prompt
            self.message("--KeyboardInterrupt--")
            self.set_quit()

    def do_interact(self, arg: str) -> None:
        """interact
        Start an interactive interpreter whose global namespace contains all the (global and
        local) names found in the current scope; exit() returns to the debugger."""
        assert self.curframe is not None
        names = {**self.curframe.f_globals, **self.curframe.f_locals}
        prompts = {name: getattr(sys, name) for name in ("ps1", "ps2") if hasattr(sys, name)}
        sys.ps1, sys.ps2 = ">>> ", "... "  # a rank has none (`distnb.rank.shell`)
        # The engine's displayhook sends a value as the cell's result, shown after the cell's
        # output: the console echoes it as a Python prompt does, in the rank's output, now.
        hook, sys.displayhook = sys.displayhook, sys.__displayhook__
        try:
            _Console(names).interact("*interactive* (exit() returns to the debugger)", exitmsg="")
        finally:
            del sys.ps1, sys.ps2
            for name, value in prompts.items():
                setattr(sys, name, value)
            sys.displayhook = hook

    # --- quitting -------------------------------------------------------------------------

    def set_quit(self) -> None:
        frame = self.curframe
        if frame is not None:
            self._quit_at = str(site(frame, frame.f_lineno, self.cell_of))
        super().set_quit()

    def trace_dispatch(self, frame: FrameType, event: str, arg: Any) -> Any:
        __tracebackhide__ = True  # IPython leaves this frame out of tracebacks
        try:
            return super().trace_dispatch(frame, event, arg)
        except bdb.BdbQuit:
            raise self.quit_error() from None

    def quit_error(self) -> DebuggerQuit:
        """What the rank raises once the user quit: its rank, and where it was."""
        at = f" at {self._quit_at}" if self._quit_at else ""
        return DebuggerQuit(f"rank {self.asker.rank} quit the debugger{at}")


def site(frame: FrameType, lineno: int, cell_of: CellOf) -> CallSite:
    """`frame`'s line as users know it: a cell's number and line, or a file and line."""
    filename = frame.f_code.co_filename
    text = linecache.getline(filename, lineno, frame.f_globals).strip()
    return CallSite(filename, lineno, cell_of(filename), text)


def user_stack(stack: Stack, index: int, cell_of: CellOf) -> tuple[Stack, int]:
    """The part of `stack` the user wrote or called, and the current frame's place in it.

    It starts at the innermost top-level code run for the user (a cell, or the script
    `%dist_run` runs as `__main__`): below that are IPython's and ipyparallel's frames. distnb's
    own frames are left out. A current frame of distnb's (a checked collective that raised)
    gives way to the innermost frame of the user's own code.
    """
    start = 0
    for k, (frame, _) in enumerate(stack[: index + 1]):
        if frame.f_code.co_name == "<module>" and (
            cell_of(frame.f_code.co_filename) is not None
            or frame.f_globals.get("__name__") == "__main__"
        ):
            start = k
    kept = [k for k in range(start, len(stack)) if not _is_distnb(stack[k][0])]
    if not kept:
        return stack, index
    script = _script_of(stack[start][0], cell_of)
    if index in kept:
        current = kept.index(index)
    else:
        own = [i for i, k in enumerate(kept) if k < index and not _is_library(stack[k][0], script)]
        below = [i for i, k in enumerate(kept) if k < index]
        current = own[-1] if own else below[-1] if below else len(kept) - 1
    return [stack[k] for k in kept], current


def _is_distnb(frame: FrameType) -> bool:
    name = frame.f_globals.get("__name__") or ""
    return name == "distnb" or name.startswith("distnb.")


def _script_of(top: FrameType, cell_of: CellOf) -> tuple[str, ...]:
    """The paths of the script `top` runs as `__main__` (`%dist_run`), which are the user's
    wherever they lie; () for a cell."""
    file = top.f_code.co_filename
    if top.f_code.co_name != "<module>" or cell_of(file) is not None:
        return ()
    return script_paths(file) if top.f_globals.get("__name__") == "__main__" else ()


def _is_library(frame: FrameType, script: tuple[str, ...] = ()) -> bool:
    return is_library(frame.f_code.co_filename, script)


@contextmanager
def _input_from(ask: Callable[[str], str]) -> Iterator[None]:
    """`input()` is `ask` inside the block (pdb's prompt, and `interact`'s, read it)."""
    saved = builtins.input
    builtins.input = ask  # type: ignore[assignment]
    try:
        yield
    finally:
        builtins.input = saved


class _Console(code.InteractiveConsole):
    """`interact`'s interpreter: the notebook cannot send Ctrl-D, so `exit()` leaves it."""

    def raw_input(self, prompt: str = "") -> str:
        line = input(prompt)
        if line.strip() in ("exit()", "quit()", "exit", "quit"):
            raise EOFError
        return line
