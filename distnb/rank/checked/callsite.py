"""Where the user called a collective: the innermost frame that is the user's own code.

Frames of torch and distnb are never the user's; frames of other installed libraries
(site-packages) and of the standard library are skipped too, so that `accelerate.gather(x)` in a
cell reports the cell's line; when the whole stack is library code, the innermost frame outside
torch and distnb is reported instead.

The same walk finds the call's **origin** (`origin.py`): the innermost library function between
the collective and the user's code that names where it comes from (DDP's constructor, FSDP2's
all-gather of a module, a compiled graph). A call made from a thread that runs no Python of the
user's (DDP's reducer on CUDA runs in autograd's threads) is placed where the main thread is.

Runs on every checked call, so it is cheap: a `sys._getframe` walk with one dict lookup per frame
(what we know about a code object is cached), and one more for the site of (code, line), which is
built once per cell: the cell resolver can map a file to a later cell after each new cell.
Notebook cells compile to files like `<ipython-input-3-abc>` or `/tmp/ipykernel_1/456.py`; the
session maps them to cell numbers with `set_cell_resolver`; without it sites are `file:line`.
"""

from __future__ import annotations

import linecache
import os
import sys
import sysconfig
import threading
from collections.abc import Callable
from types import CodeType, FrameType

import torch

from distnb.rank.checked import origin

__all__ = ["UNKNOWN", "Site", "lookup", "set_cell_resolver"]

# (file, line, cell or -1, source line): a plain tuple, so it marshals into a fingerprint as is
Site = tuple[str, int, int, str]

# torch's frames and distnb's own (this file is distnb/rank/callsite.py) are never the user's
_INTERNAL_DIRS = (
    os.path.dirname(os.path.abspath(torch.__file__ or "")) + os.sep,
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
)
_LIBRARY_DIRS = tuple(
    {
        os.path.abspath(p) + os.sep
        for key in ("purelib", "platlib", "stdlib", "platstdlib")
        if (p := sysconfig.get_paths().get(key))
    }
)
_MAX_CACHE = 4096
_CODE_LEN = 120

UNKNOWN: Site = ("<unknown>", 0, -1, "")
_MAIN = threading.main_thread()

# id(code) -> (code, 0: user's / 1: another library's / 2: torch's or distnb's, file, origin
# rule or None). Keyed by
# identity: code objects compare equal by content (not by file), so two cells with alike code
# would share an entry. Holding the code keeps its id from being reused. The cell number is
# looked up per call: IPython names a cell's file after a hash of its text, so the same text
# run again is a later cell in the same file.
Info = tuple[CodeType, int, str, "origin.Rule | None"]
_codes: dict[int, Info] = {}
_lines: dict[tuple[str, int], str] = {}
# (id(code), line) -> site; valid while `_codes` holds the code, and until the next cell
_sites: dict[tuple[int, int], Site] = {}
_resolver: Callable[[str], int | None] | None = None


def set_cell_resolver(resolver: Callable[[str], int | None] | None) -> None:
    """Map compiled-cell filenames to cell numbers from now on (None: report file:line).
    Called at the start of every cell: the sites built so far may name an older cell."""
    global _resolver
    _sites.clear()
    if resolver is not _resolver:
        _resolver = resolver
        _codes.clear()


def lookup(skip: int = 2) -> tuple[Site, str]:
    """(the user's innermost frame, the call's origin), starting `skip` frames above the caller
    (see the module doc); off the main thread, with no user frame, where the main thread is."""
    site, found = _walk(sys._getframe(skip))
    if site is UNKNOWN and threading.current_thread() is not _MAIN:
        main = sys._current_frames().get(_MAIN.ident or -1)
        if main is not None:
            site = _walk(main)[0]
    return site, found


def _walk(frame: FrameType | None) -> tuple[Site, str]:
    fallback: tuple[FrameType, Info] | None = None
    graph: tuple[FrameType, Info] | None = None  # a compiled function's own frame
    found = package = ""  # a function's own rule wins over its package's label
    while frame is not None:
        code = frame.f_code
        info = _codes.get(id(code))
        if info is None:
            info = _classify(code)
        if info[1] == 0:
            if found != origin.COMPILED or graph is not None:
                return _site(frame, info), found or package
            # A compiled function runs its graph under its own name, without line numbers:
            # the line that calls it says more.
            graph = frame, info
        rule = info[3]
        if rule is not None and not found:
            if isinstance(rule, origin.Package):
                package = package or rule.label
            else:
                found = rule if isinstance(rule, str) else rule(frame)
        if info[1] == 1 and fallback is None:
            fallback = frame, info
        frame = frame.f_back
    last = graph or fallback
    return (_site(*last) if last is not None else UNKNOWN), found or package


def _site(frame: FrameType, info: Info) -> Site:
    code, kind, file, _ = info
    line = frame.f_lineno or 0
    key = (id(code), line)
    site = _sites.get(key)
    if site is None:
        if len(_sites) >= _MAX_CACHE:
            _sites.clear()
        cell = _resolver(file) if _resolver is not None and kind == 0 else None
        site = _sites[key] = (file, line, -1 if cell is None else cell, _source(code, file, line))
    return site


def _classify(code: CodeType) -> Info:
    if len(_codes) >= _MAX_CACHE:
        _codes.clear()
        _sites.clear()
    file = code.co_filename
    path = os.path.abspath(file) if os.sep in file else ""
    rule = origin.rule_for(path, code.co_name)
    if rule == origin.COMPILED:
        kind = 1  # generated code: not the user's line, but the origin
    else:
        kind = 2 if path.startswith(_INTERNAL_DIRS) else 1 if path.startswith(_LIBRARY_DIRS) else 0
    info = (code, kind, file, rule)
    _codes[id(code)] = info
    return info


def _source(code: CodeType, file: str, line: int) -> str:
    key = (file, line)
    text = _lines.get(key)
    if text is None:
        if len(_lines) >= _MAX_CACHE:
            _lines.clear()
        text = linecache.getline(file, line).strip()[:_CODE_LEN]
        _lines[key] = text
    return text
