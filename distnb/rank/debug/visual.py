"""The rank's side of JupyterLab's visual debugger: debugpy, listening for the kernel.

`listen` starts debugpy's adapter for this rank (once per process) and returns its address;
the kernel connects to it and relays the frontend's debug requests (`distnb.session.visual`).

- Every `%%allranks` cell is compiled under the file name the kernel's debugger knows the
  notebook cell by (`name_cell`, from the control plane's `CELL_FILE` key), whether or not the
  debugger is on when it runs: breakpoints set in the cell's gutter are this rank's breakpoints
  too, and the frontend shows the rank's current line in the cell, also in a function defined
  by a cell run before the debugger was switched on.
- While the kernel is connected, `breakpoint()` stops in the visual debugger at the caller's
  line (`stop_here`), not at the text prompt.
- The time the rank sits suspended by debugpy is a stop (`stops`), as at pdb's prompt.
- pdb after debugpy is how distnb works (the text debugger once the visual one is off):
  pydevd's warning against `sys.settrace` is silenced on ranks.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

from distnb.contract import keys
from distnb.rank.debug.stops import stopped

__all__ = ["connected", "listen", "name_cell", "stop_here", "suspend_at", "trace_cells"]

_address: tuple[str, int] | None = None


# packages whose frames are not the user's: stepping passes them, as the kernel's debugger does
_NOT_MINE = ("IPython", "ipykernel", "ipyparallel", "distnb", "tornado", "zmq", "traitlets")


def listen() -> tuple[str, int, list[str]]:
    """The address of this rank's debug adapter, started on first call (loopback only), and
    the folders of the packages whose frames are not the user's."""
    global _address
    if _address is None:
        import os

        import debugpy

        # pydevd's note about frozen modules would reach the cell's output: nothing to act on
        os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
        host, port = debugpy.listen(("127.0.0.1", 0))
        _address = (str(host), int(port))
        _quiet_and_timed()
    return (*_address, _folders())


def _quiet_and_timed() -> None:
    """No warning when pdb traces after debugpy; debugpy's suspensions kept as stops."""
    pydevd, tracing = sys.modules.get("pydevd"), sys.modules.get("pydevd_tracing")
    if tracing is not None:  # debugpy's own copy of pydevd, loaded by `listen`
        tracing.TracingFunctionHolder._warn = False
    debugger = pydevd.get_global_debugger() if pydevd is not None else None
    if debugger is None or getattr(debugger.do_wait_suspend, "_distnb", False):
        return
    suspend = debugger.do_wait_suspend

    def do_wait_suspend(*args: Any, **kwargs: Any) -> Any:
        with stopped():
            return suspend(*args, **kwargs)

    do_wait_suspend._distnb = True  # type: ignore[attr-defined]
    debugger.do_wait_suspend = do_wait_suspend


def _folders() -> list[str]:
    import asyncio
    import importlib.util
    import os

    found = [os.path.dirname(asyncio.__file__)]
    for name in _NOT_MINE:
        spec = importlib.util.find_spec(name)
        found += list(spec.submodule_search_locations or []) if spec is not None else []
    return found


def connected() -> bool:
    """Whether the kernel's visual debugger is attached to this rank now."""
    if _address is None:
        return False
    import debugpy

    return bool(debugpy.is_client_connected())


def trace_cells() -> None:
    """While the kernel is connected, make sure debugpy traces the thread cells run on: pdb
    (the text debugger, used since) takes that thread's trace function and drops it when it
    ends, after which no breakpoint of the visual debugger would stop a cell."""
    if sys.gettrace() is None and connected():
        import debugpy

        debugpy.debug_this_thread()


def name_cell(shell: Any, store: Any) -> None:
    """Compile the cell about to run under the kernel's file name for it, if the kernel gave
    one (a Jupyter kernel's `%%allranks` cell)."""
    if shell is None:
        return
    name = str(store.get(keys.CELL_FILE).decode())  # set with the control plane, never missing
    if not name:
        return
    compiler = shell.compile

    def once(raw_code: str, transformed_code: str, number: int) -> str:
        del compiler.get_code_name  # the class's again from the next cell on
        return name

    if "get_code_name" not in vars(compiler):
        compiler.get_code_name = once


def stop_here(frame: FrameType) -> None:
    """Stop in the visual debugger at `frame`'s current line (what `breakpoint()` does there)."""
    from debugpy.server import api

    sys.stdout.flush()  # what the rank printed before it stops shows first
    try:
        api._settrace(  # type: ignore[no-untyped-call]
            suspend=True,
            trace_only_current_thread=True,
            patch_multiprocessing=False,
            stop_at_frame=frame,
        )
    except Exception:  # a debugpy without this internal: stop one frame in, as it would
        import debugpy

        debugpy.breakpoint()


def suspend_at(frame: FrameType) -> None:
    """Suspend this thread in the visual debugger at `frame`'s current line, from a function
    `frame` called (a stopped rank of an attached job handed to the panel, `distnb.rank.agent`),
    and return once the frontend lets it go on. `stop_here` would stop at `frame`'s *next*
    line (a step over from there): the rank would first run the call it is stopped in, a
    collective perhaps. From then on debugpy traces `frame` and its callers: `next` stops at
    the frame's next line."""
    import threading

    from debugpy.server import api  # loads debugpy's own copy of pydevd

    api._settrace(
        suspend=False,
        trace_only_current_thread=True,  # type: ignore[no-untyped-call]
        patch_multiprocessing=False,
    )
    py_db = sys.modules["pydevd"].get_global_debugger()
    set_break = sys.modules["_pydevd_bundle.pydevd_comm_constants"].CMD_SET_BREAK
    thread = threading.current_thread()
    py_db.set_trace_for_frame_and_parents(thread.ident, frame)
    py_db.set_suspend(thread, set_break)
    py_db.do_wait_suspend(thread, frame, "line", None)
