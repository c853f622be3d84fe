"""A script's imports made ahead, while the rank waits: the next run of the script starts after
them.

A `%dist_run` imports the script's libraries afresh, as a torchrun worker does
(`distnb.rank.fresh`), and most of a run after the first is that import: Lightning's 760
modules take about 0.45 s of a 0.7 s fit. Users run one script again and again, editing it
between runs. So once a script has run twice in a row (same file, argv and working
directory), each time it replies the rank waits until no cell has run for `AHEAD_S` (a notebook
run top to bottom sends its next cell at once), then runs the script's leading imports (the
statements before its first other one: `import lightning as L`, `from model import Net`) as
the next run would start them: in the state a run starts from (the reset, which nothing the
cells do reaches), as `__main__`, with the script's argv, folder and working directory. The
state they leave is set aside (`fresh.set_aside`), and the collection of the last run's
modules is made after them (`fresh.modules.postpone_collection`), so that what they made is
counted among the old objects and no full collection starts in the next run. The next run of
the script starts from that state and runs the rest of the file, where all of these hold:

- the file's leading imports (the rest may be edited), its argv and working directory are the
  same, and the rank has not joined again;
- no file of a module those imports loaded, and no folder of `sys.path`, changed since (an
  edited helper beside the script, a package installed);

else the run imports them itself, and what was made ahead ends as a run ends (its `atexit`
handlers run, their output unseen). What the imports printed is held and printed at the start
of the run, where a torchrun worker prints it.

Imports whose code stops in the debugger, makes a collective, or changes what a run cannot
carry (builtins, `sys`'s hooks, process groups: `fresh.reset.Part`) are not made ahead: the
run makes them; nor is anything while a debugger traces the rank (JupyterLab's: its
breakpoints are for runs). What it costs: the imports' time and a full collection while the
rank waits (a request sent meanwhile waits for them), and one copy of the script's libraries
held in memory between runs.
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
from distnb.rank.fresh import modules

__all__ = ["AHEAD_S", "Ready", "take", "when_idle"]

AHEAD_S = 0.1  # how long the rank has been idle (no cell) when it makes a script's imports
_CLOCK_NS = 20_000_000  # how far a file's modification time may lag the clock (the kernel's tick)


@dataclass
class Ready:
    """A script's imports, made: a run of the script with `key` starts from `made`, in
    `module`."""

    key: Key
    imports: str  # the imports' syntax tree, dumped: the run's must be the same
    module: types.ModuleType  # `__main__`, with the names the imports bound
    made: fresh.Made
    files: dict[str, tuple[int, int] | None]  # the modules' files, the path's folders: `_stats`
    output: list[tuple[str, str]]  # what the imports wrote: the stream's name, the text

    def print_output(self) -> None:
        for name, text in self.output:
            getattr(sys, name).write(text)


Key = tuple[str, tuple[str, ...], str | None]  # a script's path, argv and working directory

_ready: Ready | None = None
_last: Key | None = None  # the last run's
_pending: asyncio.TimerHandle | None = None
_collection_owed = False  # the collection once idle, postponed until the imports are made


def take(
    path: str, source: bytes, argv: Sequence[str], cwd: str | None
) -> tuple[Ready, types.CodeType] | None:
    """The script's imports made ahead, for a run of `source` at `path` with `argv` in `cwd`
    to start from, and the code of the rest of the file; None where none were made, or the
    file's imports or what they saw have changed (those made are ended)."""
    global _ready
    ready, _ready = _ready, None
    if ready is None:
        return None
    parts = _split(source, path)
    if (
        parts is not None
        and ready.key == (path, tuple(argv), cwd)
        and ready.imports == ast.dump(parts[0])
        and ready.made.join == fresh.joins()
        and _stats(ready.files) == ready.files
    ):
        return ready, asmain.compiled(parts[1], path)
    _end(ready.made)
    return None


def when_idle(path: str, argv: Sequence[str], cwd: str | None) -> None:
    """After a run: if the run before was of the same script (a script run again is run again),
    make its imports once the rank has been idle `AHEAD_S` (on the engine's event loop), then
    make the collection the run's end asked for. Without a loop (the runtime outside
    ipyparallel) or outside a rank, nothing is made ahead."""
    global _last, _collection_owed
    key: Key = (path, tuple(argv), cwd)
    again, _last = key == _last, key
    if not again or not fresh.remembered():
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    _collection_owed |= modules.postpone_collection()
    _schedule(AHEAD_S, key)


def _schedule(delay: float, key: Key) -> None:
    global _pending
    if _pending is not None:
        _pending.cancel()
    _pending = asyncio.get_running_loop().call_later(delay, _when_quiet, key)


def _when_quiet(key: Key) -> None:
    """Make the imports once no cell has run for `AHEAD_S`: a notebook run top to bottom sends
    the next cell at once, which must not wait for them."""
    global _pending, _collection_owed
    _pending = None
    quiet = shell.quiet_s()
    if quiet is None or quiet < AHEAD_S:
        _schedule(AHEAD_S - (quiet or 0.0), key)
        return
    try:
        if key == _last:  # no other script ran meanwhile
            _make(*key)
    finally:
        if _collection_owed:
            _collection_owed = False
            modules.collect()


def _make(path: str, argv: tuple[str, ...], cwd: str | None) -> None:
    global _ready
    if sys.gettrace() is not None:  # a debugger is attached: its breakpoints stop runs only
        return
    if _ready is not None:
        _end(_ready.made)
        _ready = None
    try:
        parts = _split(asmain.source_of(path), path)
    except OSError:
        return
    if parts is None:
        return
    imports, _ = parts
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
                exec(asmain.compiled(imports, path), module.__dict__)
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
    _ready = Ready((path, argv, cwd), ast.dump(imports), module, made, files, output)


def _end(made: fresh.Made) -> None:
    """What was made ahead starts no run: it ends as a worker's whose output no one reads."""
    with _held([]):
        fresh.end_aside(made)


def _split(source: bytes, path: str) -> tuple[ast.Module, ast.Module] | None:
    """The script's leading imports, and the rest of it (the docstring and `__future__`
    imports with it); None where it leads with no import (or does not parse)."""
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
    return ast.Module(imports, type_ignores=[]), ast.Module(rest, type_ignores=[])


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
    made again; the script is read again by each run)."""
    return [
        module.__file__
        for name, module in made.modules().items()
        if sys.modules.get(name) is not module
        and name != "__main__"
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
