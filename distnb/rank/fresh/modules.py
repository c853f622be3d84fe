"""Which imported modules a run gets afresh, and which the rank's process keeps.

A torchrun worker imports every library anew, so a library's singletons (Accelerate's
`PartialState`, a registry filled at import, a module-level cache) start empty. A run gets the
same by importing again what it uses: the modules imported since the rank joined are taken out
of `sys.modules` for the run (and the cells' put back after it), except those the process keeps:

- what was imported when the rank joined (torch, the engine's machinery), and every package
  those require (read from the installed distributions' metadata): torch imports sympy or
  networkx later, on first use, and must keep meeting the objects it made, not a second copy;
- the standard library (interpreter state: its shared parts are reset one by one elsewhere);
- any package with compiled code (numpy, safetensors, tokenizers): an extension module cannot
  be initialised twice in one process (numpy refuses, PyO3 modules used to), and its Python
  layer must stay the one the extension was initialised with;
- distnb itself (the session's state).

Everything else, Accelerate, transformers, the user's own packages and the modules beside the
script, is imported afresh by each run that uses it; a module whose state is only a cache of
what is installed (`caches`) is taken from an earlier run that imported it in the same setting.

A run's modules, taken out after it, are let go of where the process keeps them: `typing`
caches every generic alias it makes (`Optional[Trainer]`) and notes every `@overload`, and
the interpreter every `atexit` and fork handler registered (`hooks`), which would hold each
run's classes, and all that their modules reach, for the process's life. Let go of, they are
garbage in cycles (a function and its module's names), which only a full collection frees: one
that traverses every object the rank holds (0.2-0.3 s with a Lightning run's). The import of the
next run would set one off; it runs instead once the run's reply is out and the rank is idle
(`_collect_when_idle`), where a user reading the run's output does not wait for it.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import importlib.machinery
import importlib.metadata as metadata
import os
import re
import sys
import sysconfig
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from distnb.rank.fresh.caches import CacheFinder
from distnb.rank.fresh.hooks import Aside, RunHooks

__all__ = ["ModulesPart"]

Modules = dict[str, Any]  # sys.modules as it was: name -> module (or whatever was put there)

_STDLIB = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
_EXTENSIONS = tuple(importlib.machinery.EXTENSION_SUFFIXES)
# Always the process's: distnb, and the distributions its engines run on.
_ROOTS = ("distnb", "torch", "ipyparallel", "ipykernel")
_ABSENT = object()
IDLE_S = 0.05  # from a run's end to its modules' collection: its reply is out by then
_collection: asyncio.TimerHandle | None = None  # the collection once idle, while it waits


class ModulesPart:
    """`sys.modules`: for a run, the join's plus what the process keeps; after it, the cells'."""

    name = "imported modules"

    def __init__(self) -> None:
        self._kept: set[str] | None = None  # top-level names the process keeps
        self._compiled: set[str] = set()  # top-level packages found to hold extension modules
        self._joined: Modules = {}
        self._verdicts: dict[str, bool] = {}  # top-level name -> kept (a run checks thousands)
        self._staying: set[str] = set()  # modules found kept: they stay kept, never checked again
        self._caches = CacheFinder()  # during a run only: the cells import as they always do
        self._hooks = RunHooks()  # the run's atexit and fork handlers
        self._aside = False  # the run's modules are set aside: its end leaves them

    def capture(self) -> Modules:
        return dict(sys.modules)

    def joined(self, modules: Modules) -> None:
        """Told the join's modules at the join: what the process keeps starts there (once in a
        rank; a process that joins again judges its modules again)."""
        self._joined = modules
        self._kept = None
        self._verdicts.clear()
        self._staying.clear()

    def fresh(self, joined: Modules, carried: Aside | None = None) -> None:
        """The join's modules (or those a run's imports made ahead left, with their hooks
        `carried`: `set_aside`) and what the process keeps."""
        self._drop(joined)
        for name, module in joined.items():
            sys.modules.setdefault(name, module)
        # a file written since the last import (an edited helper next to the script) is seen
        importlib.invalidate_caches()
        self._caches.install()
        self._hooks.start(carried)

    def restore(self, saved: Modules) -> None:
        self._caches.uninstall()
        self._hooks.end(set(self._leaving(saved)))  # as the worker exits: its modules loaded
        dropped = self._drop(saved)  # with what the handlers imported
        sys.modules.update(saved)
        if self._aside:  # kept for a later run: nothing of them is let go
            self._aside = False
            return
        _let_go(dropped)
        if dropped:
            _collect_when_idle()

    def set_aside(self) -> Aside:
        """During a run: its hooks so far, which its end then leaves, as it leaves its modules
        (a capture holds them) for a later run to start from (`fresh(modules, carried)`)."""
        self._aside = True
        return self._hooks.set_aside()

    def end_aside(self, modules: Modules, hooks: Aside) -> None:
        """Modules and hooks set aside that no run will start from: ended as a run's are."""
        names = {n for n in modules if n not in self._joined and not self.kept(n)}
        self._hooks.start(hooks)
        self._hooks.end(names)
        _let_go(names)

    def _drop(self, keep: Mapping[str, Any]) -> list[str]:
        """Take out every module that is not `keep`'s (or another than `keep`'s under its name) nor
        the process's; their names."""
        leaving = self._leaving(keep)
        for name in leaving:
            del sys.modules[name]
        return leaving

    def _leaving(self, keep: Mapping[str, Any]) -> list[str]:
        """The modules loaded that are neither `keep`'s nor the process's."""
        staying, loaded = self._staying, sys.modules
        # names, not (name, module) pairs: thousands of new tuples would set off the full
        # collection the run's imports made due, here rather than once the rank is idle
        new = [
            name
            for name in list(loaded)
            if keep.get(name, _ABSENT) is not loaded.get(name) and name not in staying
        ]
        self._note_compiled(new)
        leaving = []
        for name in new:
            if self.kept(name):
                staying.add(name)
            else:
                leaving.append(name)
        return leaving

    def kept(self, name: str) -> bool:
        """Whether the module `name` stays loaded from one run to the next."""
        top = name.partition(".")[0]
        verdict = self._verdicts.get(top)
        if verdict is None:
            if self._kept is None:
                self._kept = _process_names(self._joined)
            verdict = top in self._kept or top in self._compiled or _is_stdlib(top, sys.modules)
            self._verdicts[top] = verdict
        return verdict

    def _note_compiled(self, names: Iterable[str]) -> None:
        for name in names:
            top = name.partition(".")[0]
            if top not in self._compiled and _is_extension(sys.modules.get(name)):
                self._compiled.add(top)
                self._verdicts.pop(top, None)


def _let_go(names: Iterable[str]) -> None:
    """Forget what `typing` keeps of the modules `names` (see the module): its caches of
    generic aliases are emptied (they fill again as aliases are made), and the overloads
    noted for those modules dropped."""
    for clear in getattr(typing, "_cleanups", ()):
        clear()
    registry = getattr(typing, "_overload_registry", {})
    for name in names:
        registry.pop(name, None)


def _collect_when_idle() -> None:
    """A full collection shortly after the run's reply (see the module), on the engine's event
    loop: it runs once the reply and the idle status are sent, or after the next request if one
    is already queued. Without a loop (the runtime outside ipyparallel), or with the collector
    off, the collector is left to itself."""
    global _collection
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    if _collection is not None:
        _collection.cancel()
    _collection = loop.call_later(IDLE_S, collect)


def postpone_collection() -> bool:
    """Take back the collection once idle, if one waits: for work that runs in the idle time
    first and then `collect()`s (`distnb.rank.ahead`: what it allocates then is counted among
    the old objects, not set off by the next run). Whether one waited."""
    global _collection
    if _collection is None:
        return False
    _collection.cancel()
    _collection = None
    return True


def collect() -> None:
    """The collection once idle, now."""
    global _collection
    _collection = None
    if gc.isenabled():  # a user's gc.disable() holds for distnb too
        _collect()


def _collect() -> None:
    gc.collect()  # apart: the benches time it, or switch it off


def _is_extension(module: object) -> bool:
    file = getattr(module, "__file__", None)
    return isinstance(file, str) and file.endswith(_EXTENSIONS)


def _is_stdlib(top: str, modules: Mapping[str, Any]) -> bool:
    """A standard-library module: by name, and loaded from the standard library's folder (a
    user's `logging.py` beside the script is not), or built in."""
    if top not in sys.stdlib_module_names:
        return False
    file = getattr(modules.get(top), "__file__", None)
    return not isinstance(file, str) or os.path.abspath(file).startswith(_STDLIB)


def _process_names(joined: Mapping[str, Any]) -> set[str]:
    """Top-level names of what the process keeps: the join's modules, and the import names of
    every distribution that distnb, torch and the engine require (transitively)."""
    names = {name.partition(".")[0] for name in joined} | set(_ROOTS)
    for dist in _required(_ROOTS):
        names.update(_import_names(dist))
    return names


def _required(roots: Iterable[str]) -> set[str]:
    """The distributions `roots` require, transitively (extras left out), `roots` included."""
    found = {_normal(r) for r in roots}
    todo = list(found)
    while todo:
        try:
            requires = metadata.requires(todo.pop()) or []
        except metadata.PackageNotFoundError:
            continue
        for requirement in requires:
            match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
            if match is None or re.search(r"extra\s*==", requirement):
                continue
            name = _normal(match.group(1))
            if name not in found:
                found.add(name)
                todo.append(name)
    return found


def _import_names(dist_name: str) -> set[str]:
    """The top-level import names an installed distribution provides."""
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        return set()
    listed = dist.read_text("top_level.txt")
    if listed:
        return set(listed.split())
    names = set()
    for file in dist.files or ():
        head = file.parts[0]
        if len(file.parts) == 1 and head.endswith(".py"):
            names.add(head[:-3])
        elif len(file.parts) > 1 and not head.endswith((".dist-info", ".data", "..")):
            names.add(head)
    return names


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
