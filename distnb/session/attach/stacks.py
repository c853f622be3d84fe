"""A process's stacks as py-spy reads them, and the collective a rank waits in, told from them.

`py-spy dump --native --json` (py-spy 0.4) gives every Python thread of a process, its Python
frames interleaved with its native ones (a C++ symbol, line 0, its library as the file). The
Python frames alone say which collective a rank is in when its code called `torch.distributed`
(a frame of `distributed_c10d.py`); they end in torch's C++ when the collective came from
elsewhere: DDP's reducer waiting for its gradient buckets' all_reduce at the end of backward,
the parameter check of DDP's constructor, the `wait()` of an `async_op` work. The native frames
(`c10d::...`, `gloo::...`, `nccl...`) say those. A process py-spy cannot read natively is read
again without `--native`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distnb.records.attach import StackFrame

__all__ = ["Sample", "Wait", "pyspy", "read", "user_frame", "waited"]

PYSPY_TIMEOUT_S = 20.0  # a native dump loads the symbols of torch's libraries (~1 s on 2 cores)
_COLLECTIVES = "torch/distributed/distributed_c10d.py"
# native frames that say where in torch's distributed code a thread is: kept in its stack
_NATIVE = ("c10d::", "gloo::", "nccl")
# a thread in these waits for a collective's work (`c10d::TCPStore::wait`, also c10d's, does not)
_WORK = ("c10d::Work::", "c10d::ProcessGroup", "c10d::Backend", "gloo::", "nccl")
# (a native frame's symbol holds, the op, the library code it came through)
_NATIVE_OPS = (
    ("c10d::Reducer::", "all_reduce", "DDP gradient bucket"),
    ("c10d::verify_params_across_processes", "all_gather", "DDP's parameter check"),
    ("broadcast_coalesced", "broadcast", "DDP's module states"),
)


@dataclass(frozen=True, slots=True)
class Wait:
    """The collective a thread is in: `op`, the library code it came through (`origin`, "" for
    a call of the user's own), and the innermost frame of the user's code (`site`)."""

    op: str
    origin: str
    site: StackFrame

    def __str__(self) -> str:
        how = f" ({self.origin})" if self.origin else ""
        return f"{self.op}{how} at {self.site.file}:{self.site.line}"


@dataclass(frozen=True, slots=True)
class Sample:
    """One look at a process: the stack shown for it (the thread in a collective, else its main
    thread), that collective, every thread's frames and its main thread's CPU time so far
    (`threads`, `cpu_s`: to tell whether it moved between two looks)."""

    stack: tuple[StackFrame, ...] = ()
    wait: Wait | None = None
    threads: tuple[tuple[str, tuple[StackFrame, ...]], ...] = ()
    cpu_s: float = 0.0


def pyspy() -> str | None:
    """py-spy's executable, if installed (beside this Python, or on PATH)."""
    here = Path(sys.executable).with_name("py-spy")
    return str(here) if here.exists() else shutil.which("py-spy")


def read(pid: int) -> Sample:
    """Process `pid` as py-spy sees it now; an empty `Sample` without py-spy or access."""
    cpu = cpu_s(pid)
    threads = _dump(pid)
    if not threads:
        return Sample()
    waits = [(name, frames, w) for name, frames in threads if (w := waited(frames)) is not None]
    main = [t for t in waits if t[0] == "MainThread"] or waits
    if main:
        _, stack, wait = main[0]
        return Sample(stack, wait, tuple(threads), cpu)
    stack = next((f for name, f in threads if name == "MainThread"), threads[0][1])
    return Sample(stack, None, tuple(threads), cpu)


def cpu_s(pid: int) -> float:
    """The CPU time process `pid`'s main thread has used (0.0 where /proc cannot tell)."""
    try:
        fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def waited(stack: Sequence[StackFrame]) -> Wait | None:
    """The collective a thread's stack (outermost first) is in, if any: the outermost frame of
    `distributed_c10d.py` (the user's call), else the native frame that names one (DDP's), else
    a bare wait in c10d, gloo or NCCL (`Work.wait`: an async op's work, its op not on the
    stack). Its site is the innermost frame of the user's code outside that frame (code the
    collective calls back into, such as a Python kernel of the op, is not where it was called)."""
    for i, f in enumerate(stack):
        if f.file.endswith(_COLLECTIVES) and f.function != "wrapper" and i > 0:
            return _wait(f.function, "", stack[:i])
    for marker, op, origin in _NATIVE_OPS:
        i = next((i for i, f in enumerate(stack) if f.line == 0 and marker in f.function), -1)
        if i >= 0:
            during = any(f.function.endswith("backward") for f in stack[:i])
            return _wait(op, origin + (" in backward" if during else ""), stack[:i])
    i = next((i for i, f in enumerate(stack) if f.line == 0 and f.function.startswith(_WORK)), -1)
    return _wait("Work.wait", "an async collective's work", stack[:i]) if i >= 0 else None


def _wait(op: str, origin: str, outer: Sequence[StackFrame]) -> Wait | None:
    site = user_frame(outer)
    return Wait(op, origin, site) if site is not None else None


def user_frame(stack: Sequence[StackFrame]) -> StackFrame | None:
    """The innermost Python frame outside torch (where the job's code called in), else the
    innermost Python frame."""
    python = [f for f in stack if f.line > 0 and not f.file.startswith("<frozen")]
    outside = [f for f in python if "/torch/" not in f.file.replace("\\", "/")]
    found = outside or python
    return found[-1] if found else None


def _dump(pid: int) -> list[tuple[str, tuple[StackFrame, ...]]]:
    """(thread name, frames outermost first) of each Python thread of `pid`."""
    exe = pyspy()
    if exe is None:
        return []
    for native in (["--native"], []):
        try:
            done = subprocess.run(
                [exe, "dump", "--json", *native, "--pid", str(pid)],
                capture_output=True,
                text=True,
                timeout=PYSPY_TIMEOUT_S,
                check=False,
            )
            threads: list[dict[str, Any]] = json.loads(done.stdout) if done.returncode == 0 else []
        except (subprocess.TimeoutExpired, ValueError, OSError):
            threads = []
        if threads:
            return [(str(t.get("thread_name", "")), _frames(t["frames"])) for t in threads]
    return []


def _frames(raw: list[dict[str, Any]]) -> tuple[StackFrame, ...]:
    """py-spy's frames (innermost first) as `StackFrame`s, outermost first: Python frames, and
    the native frames of torch's distributed code (the rest: libc, pybind11, the interpreter)."""
    kept = []
    for f in reversed(raw):
        name = str(f.get("name", ""))
        if f.get("module") is None and int(f.get("line", 0)) > 0:  # a Python frame
            kept.append(StackFrame(f["filename"], int(f["line"]), name))
        elif name.startswith(_NATIVE):
            kept.append(StackFrame(str(f.get("module") or f.get("filename", "")), 0, name))
    return tuple(kept)
