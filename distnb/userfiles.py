"""Whose code a file is, while `%dist_run` runs a script: the script is the user's, wherever
it lies.

Call sites, hang reports, death reports and the debugger skip installed packages' frames to
find the user's line. A script the user runs is the user's code even when it lies under
site-packages (Accelerate's own test scripts do), and so are the modules beside it, which it
imports through `sys.path[0]`. The one exception: a script lying directly in a folder of
installed packages or of the standard library, whose neighbours are libraries.

A leaf module (no torch, no IPython): the kernel and the ranks both use it.
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Sequence

__all__ = ["is_library", "is_users", "script_paths"]

_LIBRARY_ROOTS = {
    os.path.abspath(p)
    for key in ("purelib", "platlib", "stdlib", "platstdlib")
    if (p := sysconfig.get_paths().get(key))
}
_LIBRARIES = (*(root + os.sep for root in _LIBRARY_ROOTS), "<frozen")


def script_paths(script: str) -> tuple[str, ...]:
    """The user's paths while `script` runs: the script, and its folder (ending in a separator)
    unless that folder holds installed packages or the standard library. For
    `.../site-packages/accelerate/test_utils/scripts/test_ops.py`: that file, and
    `.../site-packages/accelerate/test_utils/scripts/`; for `.../site-packages/tool.py`: that
    file only.
    """
    full = os.path.abspath(script)
    folder = os.path.dirname(full)
    if folder in _LIBRARY_ROOTS:
        return (full,)
    return full, folder + os.sep


def is_users(path: str, paths: Sequence[str]) -> bool:
    """Whether the file at `path` (absolute) is one of `paths` or lies in one of its folders."""
    return any(path == p or (p.endswith(os.sep) and path.startswith(p)) for p in paths)


def is_library(path: str, script: Sequence[str] = ()) -> bool:
    """Whether the file at `path` is installed code or the standard library (not one of the
    `script`'s paths, which are the user's wherever they lie)."""
    return path.startswith(_LIBRARIES) and not is_users(path, script)
