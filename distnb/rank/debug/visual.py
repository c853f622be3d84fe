"""The rank's side of JupyterLab's visual debugger: debugpy, listening for the kernel.

`listen` starts debugpy's adapter for this rank (once per process) and returns its address;
the kernel connects to it and relays the frontend's debug requests (`distnb.session.visual`).
While the kernel is connected:

- each cell is compiled under the file name the kernel's debugger gave the notebook cell
  (`name_cell`, from the control plane's `CELL_FILE` key), so breakpoints set in the cell's
  gutter are this rank's breakpoints too, and the frontend shows the rank's current line in the
  cell;
- `breakpoint()` stops in the visual debugger at the caller's line (`stop_here`), not at the
  text prompt.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

from distnb import keys

__all__ = ["connected", "listen", "name_cell", "stop_here"]

_address: tuple[str, int] | None = None


# packages whose frames are not the user's: stepping passes them, as the kernel's debugger does
_NOT_MINE = ("IPython", "ipykernel", "ipyparallel", "distnb", "tornado", "zmq", "traitlets")


def listen() -> tuple[str, int, list[str]]:
    """The address of this rank's debug adapter, started on first call (loopback only), and
    the folders of the packages whose frames are not the user's."""
    global _address
    if _address is None:
        import debugpy

        host, port = debugpy.listen(("127.0.0.1", 0))
        _address = (str(host), int(port))
    return (*_address, _folders())


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


def name_cell(shell: Any, store: Any) -> None:
    """Compile the cell about to run under the kernel's file name for it, if the visual
    debugger is attached and the kernel gave one."""
    if shell is None or not connected():
        return
    name = str(store.get(keys.CELL_FILE).decode())
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
            suspend=True, trace_only_current_thread=True, patch_multiprocessing=False,
            stop_at_frame=frame,
        )  # fmt: skip
    except Exception:  # a debugpy without this internal: stop one frame in, as it would
        import debugpy

        debugpy.breakpoint()
