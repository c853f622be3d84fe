"""Where the user called a collective: the innermost frame that is the user's own code.

Frames of torch and distnb are never the user's; frames of other installed libraries
(site-packages) and of the standard library are skipped too, so that `accelerate.gather(x)` in a
cell reports the cell's line; when the whole stack is library code, the innermost frame outside
torch and distnb is reported instead. A script run with `%dist_run` and the modules beside it
are the user's wherever they lie, under site-packages too (`set_user_paths`).

The same walk finds the call's **origin** (`origin.py`): the innermost library function between
the collective and the user's code that names where it comes from (DDP's constructor, FSDP2's
all-gather of a module, a compiled graph). A call made from a thread that runs no Python of the
user's (DDP's reducer on CUDA runs in autograd's threads) is placed where the main thread is.

A compiled graph runs generated code, not the user's lines: its call site is the user's line
that the graph's node was traced from (`graphs.py`), and its origin names the line that called
the compiled function ("compiled graph, called at cell In[4] line 7"). Where no recorded line can
be trusted (none recorded, or inductor's cache served a graph another function compiled), the
site is that calling line and the origin "compiled graph".

Runs on every checked call, so it is cheap: a `sys._getframe` walk with one dict lookup per frame
(what we know about a code object is cached), and one more for the site of (code, line), which is
built once per cell: the cell resolver can map a file to a later cell after each new cell.
Notebook cells compile to files like `<ipython-input-3-abc>` or `/tmp/ipykernel_1/456.py`; the
session maps them to cell numbers with `set_cell_resolver`; without it sites are `file:line`.
"""

from __future__ import annotations

import linecache
import os
import re
import sys
import sysconfig
import threading
from collections.abc import Callable
from types import CodeType, FrameType

import torch

from distnb.rank.checked import frameworks, graphs, origin
from distnb.records.collective import CallSite
from distnb.userfiles import is_users

__all__ = ["UNKNOWN", "Site", "lookup", "set_cell_resolver", "set_user_paths", "user_paths"]

# (file, line, cell or -1, source line): a plain tuple, so it marshals into a fingerprint as is
Site = tuple[str, int, int, str]

# torch's frames and distnb's own (this file is distnb/rank/callsite.py) are never the user's
_INTERNAL_DIRS = (
    os.path.dirname(os.path.abspath(torch.__file__ or "")) + os.sep,
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep,
)
_LIBRARY_DIRS = tuple(
    {
        os.path.abspath(p) + os.sep
        for key in ("purelib", "platlib", "stdlib", "platstdlib")
        if (p := sysconfig.get_paths().get(key))
    }
)
# an installed package's file in a recorded stack, which may be another install's (see `_traced`)
_INSTALLED = re.compile(r"[/\\](?:site|dist)-packages[/\\]")
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
Info = tuple[CodeType, int, str, "origin.Rule | frameworks.Framework | None"]
_codes: dict[int, Info] = {}
_lines: dict[tuple[str, int], str] = {}
# (id(code) or a file, line) -> site; valid while `_codes` holds the code, until the next cell
_sites: dict[tuple[int | str, int], Site] = {}
_resolver: Callable[[str], int | None] | None = None
# the running script's paths (`userfiles.script_paths`): the user's code wherever they lie
_user: tuple[str, ...] = ()


def set_cell_resolver(resolver: Callable[[str], int | None] | None) -> None:
    """Map compiled-cell filenames to cell numbers from now on (None: report file:line).
    Called at the start of every cell: the sites built so far may name an older cell."""
    global _resolver
    _sites.clear()
    if resolver is not _resolver:
        _resolver = resolver
        _codes.clear()


def set_user_paths(paths: tuple[str, ...]) -> None:
    """From now on the files at `paths` (a script, a folder ending in a separator) are the
    user's code, wherever they lie; `()` when the script has ended."""
    global _user
    if paths != _user:
        _user = paths
        _codes.clear()
        _sites.clear()


def user_paths() -> tuple[str, ...]:
    """The running script's paths (`set_user_paths`), `()` between scripts."""
    return _user


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
    recorded: graphs.Stack = ()  # the stack a compiled graph's node was traced with
    compiled = ""  # the file of the frame that runs the compiled function, once found
    # a torch function's own rule wins over a framework's (the outermost), and that over a
    # torch package's label
    found = framework = package = ""
    while frame is not None:
        code = frame.f_code
        if recorded and not compiled and _runs(code, recorded[-1]):
            compiled = code.co_filename
        info = _codes.get(id(code))
        if info is None:
            info = _classify(code)
        if info[1] == 0:
            if found != origin.COMPILED:
                return _site(frame, info), found or framework or package
            if graph is not None:
                traced = _traced(recorded, compiled) if compiled else None
                return _compiled(traced, _site(frame, info))
            # A compiled function's own frame runs its graph, at the line of its `def`: the
            # line that calls it says more.
            graph = frame, info
        rule = info[3]
        if rule is not None and not found:
            if isinstance(rule, origin.Package):
                package = package or rule.label
            elif isinstance(rule, frameworks.Framework):
                framework = rule.label
            else:
                found = rule if isinstance(rule, str) else rule(frame)
                if found == origin.COMPILED:
                    recorded = graphs.recorded_stack(frame)
        if info[1] == 1 and fallback is None:
            fallback = frame, info
        frame = frame.f_back
    traced = _traced(recorded, compiled) if compiled else None
    if traced is not None:
        return traced, found
    last = graph or fallback
    return (_site(*last) if last is not None else UNKNOWN), found or framework or package


def _runs(code: CodeType, outermost: tuple[str, int, str, str]) -> bool:
    """Whether `code` is the compiled function a recorded stack starts in: the same function,
    reading at the recorded line as recorded. Its file may differ: inductor's cache serves a
    graph with the stack of the process that compiled it first, and a notebook cell's file is
    named after its process (`/tmp/ipykernel_<pid>/<hash>.py`)."""
    file, line, name, text = outermost
    if code.co_name != name:
        return False
    return code.co_filename == file or _source(code.co_filename, line) == text[:_CODE_LEN]


def _traced(recorded: graphs.Stack, compiled: str) -> Site | None:
    """The user's innermost line in a graph node's recorded stack that reads as it was recorded
    (see `graphs`: a cached graph's stack may be another process's, even another install's, so
    any installed package's file is a library's), the compiled function's file standing for the
    recorded one. A helper the graph inlined from a file that has gone
    gives way to the line in the compiled function that called it."""
    first = recorded[-1][0]
    for file, line, _, text in recorded:
        file = compiled if file == first else file
        path = os.path.abspath(file) if os.sep in file else ""
        installed = _INSTALLED.search(path) and not is_users(path, _user)
        if _kind(path) != 0 or installed or graphs.is_generated(file):
            continue
        site = _file_site(file, line)
        if site[3] == text[:_CODE_LEN]:
            return site
    return None


def _compiled(traced: Site | None, caller: Site) -> tuple[Site, str]:
    """A compiled graph's call: the user's traced line, and the line that called the compiled
    function in the origin (or that line as the site, where no line was recorded)."""
    if traced is None:
        return caller, origin.COMPILED
    file, line, cell, _ = caller
    where = CallSite(file, line, None if cell < 0 else cell)
    return traced, f"{origin.COMPILED}, called at {where}"


def _site(frame: FrameType, info: Info) -> Site:
    code, kind, file, _ = info
    line = frame.f_lineno or 0
    key = (id(code), line)
    site = _sites.get(key)
    if site is None:
        if len(_sites) >= _MAX_CACHE:
            _sites.clear()
        cell = _resolver(file) if _resolver is not None and kind == 0 else None
        site = _sites[key] = (file, line, -1 if cell is None else cell, _source(file, line))
    return site


def _file_site(file: str, line: int) -> Site:
    """The site of a line of the user's known by file and line only (no frame runs it)."""
    key = (file, line)
    site = _sites.get(key)
    if site is None:
        if len(_sites) >= _MAX_CACHE:
            _sites.clear()
        cell = _resolver(file) if _resolver is not None else None
        site = _sites[key] = (file, line, -1 if cell is None else cell, _source(file, line))
    return site


def _classify(code: CodeType) -> Info:
    if len(_codes) >= _MAX_CACHE:
        _codes.clear()
        _sites.clear()
    file = code.co_filename
    path = os.path.abspath(file) if os.sep in file else ""
    if graphs.is_generated(file):
        info: Info = (code, 1, file, origin.COMPILED)  # not the user's line, but the origin
    else:
        name = code.co_name
        rule = origin.rule_for(path, name) or frameworks.framework_for(path, name)
        info = (code, _kind(path), file, rule)
    _codes[id(code)] = info
    return info


def _kind(path: str) -> int:
    """0: the user's file, 1: another library's, 2: torch's or distnb's (`path` absolute)."""
    if _user and is_users(path, _user):
        return 0
    return 2 if path.startswith(_INTERNAL_DIRS) else 1 if path.startswith(_LIBRARY_DIRS) else 0


def _source(file: str, line: int) -> str:
    key = (file, line)
    text = _lines.get(key)
    if text is None:
        if len(_lines) >= _MAX_CACHE:
            _lines.clear()
        text = linecache.getline(file, line).strip()[:_CODE_LEN]
        _lines[key] = text
    return text
