"""A script's file as `__main__`, as `python script.py args` runs it: its code, its module, and
`sys.argv`, `sys.path[0]` and the working directory set while it runs."""

from __future__ import annotations

import ast
import builtins
import os
import sys
import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress

__all__ = ["as_main", "compiled", "main_module", "source_of"]


def source_of(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def compiled(source: bytes | ast.Module, path: str) -> types.CodeType:
    """The code of `source` (the file's bytes, or a syntax tree of part of it)."""
    # the real path as the file name: tracebacks and call sites name the script and its lines
    return compile(source, path, "exec", dont_inherit=True)


def main_module(path: str) -> types.ModuleType:
    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=path, __builtins__=builtins, __cached__=None)
    return module


@contextmanager
def as_main(
    module: types.ModuleType,
    path: str,
    argv: Sequence[str],
    cwd: str | None,
    *,
    folder_in_path: bool = False,
) -> Iterator[None]:
    """`module` is `__main__`, argv and the script's folder (unless `folder_in_path`: `sys.path`
    already starts with it) are set; all restored on leaving."""
    saved_main = sys.modules.get("__main__")
    saved_argv, saved_path = sys.argv, list(sys.path)
    saved_cwd = os.getcwd()
    sys.modules["__main__"] = module
    sys.argv = list(argv) or [path]
    if not folder_in_path:
        sys.path.insert(0, os.path.dirname(path))
    if cwd is not None and os.path.isdir(cwd):
        os.chdir(cwd)
    try:
        yield
    finally:
        if saved_main is not None:
            sys.modules["__main__"] = saved_main
        sys.argv = saved_argv
        sys.path[:] = saved_path
        with suppress(OSError):
            os.chdir(saved_cwd)
