"""The user's lines behind a collective that a compiled graph calls.

`torch.compile` runs generated code in place of the user's: inductor's output module (a file in
its cache folder) or an FX GraphModule's `forward` (file `<eval_with_key>.N`: the eager and
aot_eager backends, and graphs inductor leaves to FX). Their frames name generated lines
(`torch.ops._c10d_functional.all_reduce_.default(buf0, 'sum', '0')`), alike on every rank. The
user's lines are in the stack trace dynamo records on each graph node while it traces the
function (`node.meta["stack_trace"]`), which AOTAutograd and inductor carry along:

- inductor keeps them per generated line (`PyCodeCache.linemaps`, read the way its own
  `stack_frames_for_code` reads them);
- a GraphModule maps its code's lines to its nodes (`_lineno_map`, read the way dynamo reads it).

`recorded_stack(frame)` returns the stack of the node a generated frame is running, innermost
first; `callsite` picks the user's frame out of it. Each (code, line) is looked up once. Both are
torch internals: where they are missing or have moved, the stack is empty and the call site falls
back to the line that called the compiled function.

A recorded stack can be another program's: inductor's on-disk cache serves a graph compiled
before, by any process, with the stack traces of that compile (they are not part of its key), so
an identical graph traced from another file or cell names that file's lines. Each recorded frame
carries its source text, and `callsite` uses a stack only where its outermost frame (the compiled
function) is one that runs now and the user's line still reads as recorded. (Measured on torch
2.13: a graph served from the cache keeps its first compile's stacks, across processes too; the
eager and aot_eager backends trace afresh in every process.)
"""

from __future__ import annotations

import bisect
import itertools
import re
import sys
from types import CodeType, FrameType
from typing import Any

__all__ = ["Stack", "is_generated", "recorded_stack"]

# (file, line, function, source text), innermost first
Stack = tuple[tuple[str, int, str, str], ...]

_FX_FILE = "<eval_with_key>"  # GraphModule code; "<eval_with_key>.9 from .../x.py:1 in f" too
_INDUCTOR_DIR = "torchinductor"  # in the default cache folder, /tmp/torchinductor_<user>/
# a frame of `traceback`'s text: `  File "x.py", line 3, in f` and its source line, if any
_TRACE_FRAME = re.compile(r'^  File "(.+)", line (\d+), in (.+)\n(?:    (.*)\n)?', re.MULTILINE)
_MAX_CACHE = 4096

# (id(code), line) -> (code, stack); holding the code keeps its id from being reused
_stacks: dict[tuple[int, int], tuple[CodeType, Stack]] = {}


def is_generated(file: str) -> bool:
    """Whether `file` (a code object's `co_filename`) holds code that `torch.compile` made."""
    if file.startswith(_FX_FILE) or _INDUCTOR_DIR in file:
        return True
    # inductor's cache folder moved (TORCHINDUCTOR_CACHE_DIR): the modules it loaded
    codecache: Any = sys.modules.get("torch._inductor.codecache")
    return codecache is not None and file in getattr(codecache.PyCodeCache, "linemaps", {})


def recorded_stack(frame: FrameType) -> Stack:
    """The recorded stack of the graph node that generated `frame` runs now (empty if none)."""
    code = frame.f_code
    line = frame.f_lineno or 0
    key = (id(code), line)
    hit = _stacks.get(key)
    if hit is not None:
        return hit[1]
    if len(_stacks) >= _MAX_CACHE:
        _stacks.clear()
    try:
        if code.co_filename.startswith(_FX_FILE):
            stack = _fx_stack(frame.f_locals.get("self"), line - code.co_firstlineno)
        else:
            stack = _inductor_stack(code.co_filename, line)
    except Exception:  # a torch whose internals differ: the caller's line names the call
        stack = ()
    _stacks[key] = (code, stack)
    return stack


def _fx_stack(module: Any, offset: int) -> Stack:
    """The stack of the node at line `offset` of a GraphModule's `forward`."""
    lines = getattr(module, "_lineno_map", None)
    graph = getattr(module, "graph", None)
    index = lines.get(offset) if lines else None
    if graph is None or index is None:
        return ()
    node = next(itertools.islice(graph.nodes, index, None), None)
    return _parse(node.meta.get("stack_trace") if node is not None else None)


def _inductor_stack(file: str, line: int) -> Stack:
    """The stack of the node at `line` of inductor's module `file`: the last entry of its line
    map (generated line, the node's stack trace) at or above `line`, as inductor reads it."""
    codecache: Any = sys.modules.get("torch._inductor.codecache")
    entries = codecache.PyCodeCache.linemaps.get(file) if codecache is not None else None
    if not entries:
        return ()
    starts, traces = entries
    at = bisect.bisect_right(starts, line)
    return _parse(traces[at - 1]) if at else ()


def _parse(trace: object) -> Stack:
    """A recorded stack trace (text, as `traceback` formats it: outermost first) as frames,
    innermost first."""
    if not isinstance(trace, str):
        return ()
    frames = _TRACE_FRAME.findall(trace)
    return tuple((file, int(line), name, code.strip()) for file, line, name, code in frames[::-1])
