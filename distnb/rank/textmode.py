"""Widgets on a rank whose session has no widget frontend (terminal IPython, a script).

An engine is an IPython kernel, so `tqdm.auto` picks its widget bar there, and `ipywidgets`
open comms. Those comm messages travel to the kernel, where ipyparallel relays them only inside
a Jupyter kernel: in terminal IPython its output dispatch raises `AttributeError:
'TerminalInteractiveShell' object has no attribute 'kernel'` and stops for good, so every later
cell waits for output that never comes. `use_text_frontend()` makes the rank's `tqdm.auto` the
text bar (its output labelled by rank like any stderr) and its comms silent (`comm`'s own
`DummyComm`, what `comm.create_comm` gives outside a kernel), so a widget shows as its text.
"""

from __future__ import annotations

import sys
import types
from typing import Any

__all__ = ["use_text_frontend"]


def use_text_frontend() -> None:
    """From now on this rank draws tqdm bars as text and sends no comm messages."""
    import comm

    def create_comm(*args: Any, **kwargs: Any) -> comm.base_comm.BaseComm:
        return comm.DummyComm(*args, **kwargs)

    comm.create_comm = create_comm
    _text_tqdm()


def _text_tqdm() -> None:
    """`tqdm.auto` as tqdm chooses it in a console, whether it was imported already or not."""
    from tqdm import asyncio, std

    text = types.ModuleType("tqdm.autonotebook", "tqdm.autonotebook, text bars only (distnb)")
    text.tqdm = std.tqdm  # type: ignore[attr-defined]
    text.trange = std.trange  # type: ignore[attr-defined]
    sys.modules["tqdm.autonotebook"] = text
    auto = sys.modules.get("tqdm.auto")
    if auto is not None:  # `tqdm.auto.trange` looks its `tqdm` up when called
        auto.tqdm = asyncio.tqdm  # type: ignore[attr-defined]
