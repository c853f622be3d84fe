"""The file names JupyterLab's debugger knows `%%allranks` cells by, and their sources.

JupyterLab finds the cell of a stopped frame by its file name: ipykernel's name for the cell's
text (`ipykernel.compiler.get_file_name`, a hash of the raw cell in the kernel's temporary
folder), which the frontend computes itself from each cell. Ranks compile every `%%allranks`
cell under that name (`distnb.rank.debug.visual.name_cell`), debugger on or off when it ran, so
a frame in a function defined by any earlier cell shows in that cell with its line highlighted.
For a file the frontend cannot match to a cell (the cell was edited since) it asks `source`:
the relay answers from the cells kept here, which were never written to the kernel's disk.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CellFiles"]

KEPT = 256  # the last cells whose source is kept

Message = dict[str, Any]


class CellFiles:
    """The running cell's file name (`current`), and the sources of recent `%%allranks` cells;
    `remember` is the shell's `pre_run_cell` hook."""

    def __init__(self) -> None:
        self.raw_cell = ""
        self.sources: dict[str, str] = {}

    def remember(self, info: Any) -> None:
        self.raw_cell = getattr(info, "raw_cell", "") or ""

    def current(self) -> str:
        """The running cell's file name, if it is an `%%allranks` cell; "" for other code."""
        if not self.raw_cell.lstrip().startswith("%%allranks"):
            return ""
        from ipykernel.compiler import get_file_name

        name = str(get_file_name(self.raw_cell))  # type: ignore[no-untyped-call]
        self.sources.pop(name, None)
        self.sources[name] = self.raw_cell
        while len(self.sources) > KEPT:
            del self.sources[next(iter(self.sources))]
        return name

    def source(self, message: Message) -> Message | None:
        """The answer to a `source` request for a cell the ranks ran; None for other files."""
        path = (message.get("arguments") or {}).get("source", {}).get("path")
        text = self.sources.get(path) if isinstance(path, str) else None
        if text is None:
            return None
        return {
            "type": "response",
            "request_seq": message.get("seq", 0),
            "command": "source",
            "success": True,
            "body": {"content": text},
        }
