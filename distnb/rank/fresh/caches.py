"""Modules a run may take from an earlier run instead of importing them again: those whose whole
state is a cache of the installed files and the environment.

A run imports pure-Python libraries afresh (`distnb.rank.fresh.modules`), which for most costs a
fraction of a second. transformers' `import_utils` is the exception: at import, transformers
reads the source of every model folder to build its lazy import structure, cached in that
module. It is reached from Lightning (through torchmetrics) and from every transformers import,
and took 1.0 s of a 1.4 s Lightning run (`bench/bench_frameworks.py`). Its module-level state is
constants and `lru_cache`s of what is installed and what the environment says; a fresh import
under the same environment and files makes the same. So a run reuses the copy an earlier run
imported when `os.environ`, `sys.path` and the site folders are as they were at that import,
with the module's names as they were right after it (a run that rebinds one, a test's patch,
leaves no trace); otherwise it imports it as usual, and keeps that copy too. Lightning sets a
variable of its own before it imports transformers, so its runs and a Trainer's each keep one;
the `KEPT` most recently used copies are kept.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import site
import sys
import sysconfig
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["CACHES", "KEPT", "CacheFinder"]

CACHES = frozenset({"transformers.utils.import_utils"})
KEPT = 4

Key = tuple[Any, ...]  # what a cache module's import saw: environment, path, the path's folders


class CacheFinder(importlib.abc.MetaPathFinder):
    """First on `sys.meta_path` during a run: finds `CACHES` modules, as kept or afresh."""

    def __init__(self) -> None:
        # (name, key) -> the module and its names right after its import; oldest use first
        self.kept: dict[tuple[str, Key], tuple[ModuleType, dict[str, Any]]] = {}

    def install(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def uninstall(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in CACHES:
            return None
        key = _key()
        found = self.kept.pop((fullname, key), None)
        if found is not None:
            self.kept[fullname, key] = found  # the most recently used last
            return importlib.machinery.ModuleSpec(fullname, _Again(*found))
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Afresh(spec.loader, self, key)
        return spec


class _Afresh(importlib.abc.Loader):
    """The usual import, its module noted with what it saw once it ran."""

    def __init__(self, loader: Any, finder: CacheFinder, key: Key) -> None:
        self.loader, self.finder, self.key = loader, finder, key

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self.loader.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        spec = module.__spec__
        assert spec is not None  # the import machinery set it (`module_from_spec`)
        module.__loader__ = spec.loader = self.loader  # as a plain import leaves them
        self.loader.exec_module(module)
        kept = self.finder.kept
        kept[module.__name__, self.key] = (module, dict(module.__dict__))
        while len(kept) > KEPT:
            del kept[next(iter(kept))]


class _Again(importlib.abc.Loader):
    """The kept module, its names set back to those its import left."""

    def __init__(self, module: ModuleType, names: dict[str, Any]) -> None:
        self.module, self.names = module, names

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return self.module

    def exec_module(self, module: ModuleType) -> None:
        module.__dict__.clear()
        module.__dict__.update(self.names)  # `__spec__` too: the import machinery set its own


def _key() -> Key:
    """The environment, the path, and the installed packages (the site folders change as a
    package is installed or removed)."""
    folders: list[int | None] = []
    for folder in _SITE:
        try:
            folders.append(os.stat(folder).st_mtime_ns)
        except OSError:
            folders.append(None)
    return tuple(sorted(os.environ.items())), tuple(sys.path), tuple(folders)


_SITE = sorted(
    {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    | set(site.getsitepackages())
    | {site.getusersitepackages()}
)
