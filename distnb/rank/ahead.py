"""A script's imports made ahead, while the rank waits: the next run of the script starts after
them.

A `%dist_run` imports the script's libraries afresh, as a torchrun worker does
(`distnb.rank.fresh`), and most of a run after the first is that import: Lightning's 760
modules take about 0.4 s of a 0.5 s fit. Users run one script again and again. So once a run has
replied and its modules are collected (`fresh.modules`), the rank runs the script's leading
imports (the statements before its first other one: `import lightning as L`,
`from model import Net`) as the next run would start them: in the state a run starts from (the
reset, which nothing the cells do reaches), as `__main__`, with the script's argv, folder and
working directory. The state they leave is set aside (`fresh.set_aside`). The next run of the
script starts from it and runs the rest of the file, where all of these hold:

- the file, its argv and working directory are the same, and the rank has not joined again;
- no file of a module those imports loaded, and no folder of `sys.path`, changed since (an
  edited helper beside the script, a package installed);

else the run imports them itself, and what was made ahead ends as a run ends (its `atexit`
handlers run). What the imports printed is held and printed at the start of the run, where a
torchrun worker prints it.

Imports whose code stops in the debugger, makes a collective, or changes what a run cannot
carry (builtins, `sys`'s hooks, process groups: `fresh.reset.Part`) are not made ahead: the
run makes them; nor is anything while a debugger traces the rank (JupyterLab's: its
breakpoints are for runs). What it costs: the imports' time while the rank waits (a request sent
meanwhile waits for them, and a run sent then starts after them), and one copy of the
script's libraries held in memory between runs.
"""

from __future__ import annotations

import ast
import asyncio
import gc
import os
import sys
import time
import types
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from distnb.rank import asmain, checked, fresh, shell

__all__ = ["AHEAD_S", "Ready", "take", "when_idle"]

# From a run's end to the next one's imports: its reply is out, and its modules' collection
# (`fresh.modules.IDLE_S`) comes after them, to count what they made among the old objects.
AHEAD_S = 0.02
_CLOCK_NS = 20_000_000  # how far a file's modification time may lag the clock (the kernel's tick)


@dataclass
class Ready:
    """A script's imports, made: the next run of the script starts from `made` and runs `rest`
    in `module`."""

    path: str
    source: bytes
    argv: tuple[str, ...]
    cwd: str | None
    module: types.ModuleType  # `__main__`, with the names the imports bound
    rest: types.CodeType  # the script after its imports
    made: fresh.Made
    files: dict[str, tuple[int, int] | None]  # the modules' files, the path's folders: `_stats`
    output: list[tuple[str, str]]  # what the imports wrote: the stream's name, the text

    def print_output(self) -> None:
        for name, text in self.output:
            getattr(sys, name).write(text)


_ready: Ready | None = None
_pending: asyncio.TimerHandle | None = None


def take(path: str, source: bytes, argv: Sequence[str], cwd: str | None) -> Ready | None:
    """The script's imports made ahead, for a run of it with `argv` in `cwd` to start from;
    None where none were made or what they saw has changed (and those are ended)."""
    global _ready
    ready, _ready = _ready, None
    if ready is None:
        return None
    if (
        (ready.path, ready.source, ready.argv, ready.cwd) == (path, source, tuple(argv), cwd)
        and ready.made.join == fresh.joins()
        and _stats(ready.files) == ready.files
    ):
        return ready
    _end(ready.made)
    return None


def when_idle(path: str, source: bytes, argv: Sequence[str], cwd: str | None) -> None:
    """Make the script's imports once the rank is idle (on the engine's event loop, after the
    reply); without a loop (the runtime outside ipyparallel) or outside a rank, nothing is made
    ahead."""
    global _pending
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    if not fresh.remembered():  # not a rank: no run starts from a fresh state
        return
    if _pending is not None:
        _pending.cancel()
    _pending = loop.call_later(AHEAD_S, _make, path, source, tuple(argv), cwd)


def _make(path: str, source: bytes, argv: tuple[str, ...], cwd: str | None) -> None:
    global _ready, _pending
    _pending = None
    if shell.in_cell():  # a cell that awaits lets the loop run: after it
        when_idle(path, source, argv, cwd)
        return
    if sys.gettrace() is not None:  # a debugger is attached: its breakpoints stop runs only
        return
    if _ready is not None:
        _end(_ready.made)
        _ready = None
    parts = _split(source, path)
    if parts is None:
        return
    imports, rest = parts
    module = asmain.main_module(path)
    output: list[tuple[str, str]] = []
    made: fresh.Made | None = None
    started = time.time_ns()
    collecting = gc.isenabled()
    gc.disable()  # the collection once idle follows: one full collection, not a few meanwhile
    try:
        with _held(output), fresh.as_fresh(), asmain.as_main(module, path, argv, cwd):
            before = fresh.unchanged()
            with _refused():
                exec(imports, module.__dict__)
            folders = [os.path.abspath(folder or ".") for folder in sys.path]
            made = fresh.set_aside(before)
    except BaseException:  # the run makes them itself, and says what failed
        if made is not None:
            _end(made)
        return
    finally:
        if collecting:
            gc.enable()
    if made is None:
        return
    files = _stats(_files(made))
    if any(stat is not None and stat[0] >= started - _CLOCK_NS for stat in files.values()):
        _end(made)  # a file changed as it was read: the run reads it
        return
    files.update(_stats(folders))
    _ready = Ready(path, source, argv, cwd, module, rest, made, files, output)


def _end(made: fresh.Made) -> None:
    """What was made ahead starts no run: it ends as a worker's whose output no one reads."""
    with _held([]):
        fresh.end_aside(made)


def _split(source: bytes, path: str) -> tuple[types.CodeType, types.CodeType] | None:
    """The code of the script's leading imports, and of the rest of it (the docstring and
    `__future__` imports with it); None where it leads with no import (or does not compile)."""
    try:
        body = ast.parse(source, path).body
    except (SyntaxError, ValueError):
        return None
    imports: list[ast.stmt] = []
    rest: list[ast.stmt] = []
    for n, statement in enumerate(body):
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            if isinstance(statement, ast.ImportFrom) and statement.module == "__future__":
                rest.append(statement)
            else:
                imports.append(statement)
        elif n == 0 and _docstring(statement):
            rest.append(statement)
        else:
            rest += body[n:]
            break
    if not imports:
        return None
    return (
        asmain.compiled(ast.Module(imports, type_ignores=[]), path),
        asmain.compiled(ast.Module(rest, type_ignores=[]), path),
    )


def _docstring(statement: ast.stmt) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


class _NotAhead(Exception):
    """What the imports do must be done in the run."""


def _stop(*args: Any, **kwargs: Any) -> None:
    raise _NotAhead("the debugger stops")


@contextmanager
def _refused() -> Iterator[None]:
    """Stops in the debugger and collectives raise, leaving them to the run."""
    hook, sys.breakpointhook = sys.breakpointhook, _stop
    try:
        with checked.refused(_NotAhead("a collective")):
            yield
    finally:
        sys.breakpointhook = hook


@contextmanager
def _held(output: list[tuple[str, str]]) -> Iterator[None]:
    """What is written to `sys.stdout` and `sys.stderr` goes to `output`. The streams stay the
    same objects (a logging handler made now holds the one a run's would): their `write` is
    replaced on the object."""
    streams = [(name, getattr(sys, name)) for name in ("stdout", "stderr")]
    held = []
    for name, stream in streams:

        def write(text: str, name: str = name) -> int:
            output.append((name, text))
            return len(text)

        try:
            stream.write = write
        except AttributeError:  # a stream without instance attributes writes as it writes
            continue
        held.append(stream)
    try:
        yield
    finally:
        for stream in held:
            del stream.write


def _files(made: fresh.Made) -> list[str]:
    """The files of the modules the imports loaded afresh (those the process keeps are not
    made again)."""
    return [
        module.__file__
        for name, module in made.modules().items()
        if sys.modules.get(name) is not module
        and isinstance(getattr(module, "__file__", None), str)
    ]


def _stats(paths: Iterable[str]) -> dict[str, tuple[int, int] | None]:
    """Each file's (or folder's) modification time and size, as Python's own cached code is
    checked; None where there is none."""
    stats: dict[str, tuple[int, int] | None] = {}
    for path in paths:
        try:
            found = os.stat(path)
        except OSError:
            stats[path] = None
        else:
            stats[path] = found.st_mtime_ns, found.st_size
    return stats
