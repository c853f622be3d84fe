"""The engine's IPython shell, bound to its rank: the rank's names, cell numbers, cell hooks.

`bind` (from `distnb.rank.runtime.init`) puts the rank's names in the engine's namespace and
registers the hooks around each cell: `pre_run_cell` picks up the kernel's cell number from the
control plane so that rank tracebacks and call sites say the same `In[N]` as the notebook, and
begins the run for the checked runtime and the debugger; `post_run_cell` ends it. Warnings
raised by a cell's own lines name them the same way (`cell In[7] line 4: UserWarning: ...`),
not by the file ipykernel compiled the cell as (`/tmp/ipykernel_<pid>/<hash>.py:4`, which
exists nowhere the user can open). A rank is a worker the notebook drives, not a console:
IPython's `sys.ps1` and `sys.ps2`, by which a script tells it is typed at a prompt, go
(Lightning's `Trainer` and `Fabric` refuse `strategy="ddp"` where they are; a torchrun worker
has neither), while the notebook's kernel keeps its own. `unbind` (from `shutdown`) takes the
hooks off and puts the prompts back. Outside ipyparallel (tests, scripts) there is no shell:
`namespace()` is empty and no file is a cell.
"""

from __future__ import annotations

import linecache
import sys
import time
import warnings
from contextlib import AbstractContextManager, suppress
from typing import Any

import torch
import torch.distributed as dist

from distnb.contract import keys
from distnb.rank import checked, debug
from distnb.rank.world import World
from distnb.records.cell import RankSpec

__all__ = ["bind", "cell_of_file", "namespace", "quiet_s", "unbind"]

# `unchecked()` blocks opened for a cell run with checks off, closed when it ends.
_cell_unchecked: list[AbstractContextManager[None]] = []

# The engine's IPython shell; None when the runtime is used outside ipyparallel (tests, scripts).
_shell: Any = None

# The rank's default group (and through it the control plane's store) while the shell is bound.
_world: World | None = None

# Whether a cell runs now (from its pre_run_cell to its post_run_cell), and when the last ended.
_cell_running = False
_cell_ended = time.monotonic()

# IPython's `sys.ps1` and `sys.ps2`, taken away while the shell is bound.
_prompts: dict[str, Any] = {}

# `warnings.formatwarning` as it was before `bind` put `_format_warning` in its place.
_formatwarning = warnings.formatwarning


def namespace() -> dict[str, Any]:
    """The engine's namespace (the user's names); empty outside ipyparallel."""
    return _shell.user_ns if _shell is not None else {}


def bind(spec: RankSpec, device: torch.device, world: World) -> None:
    """Put the rank's names in the engine's namespace and hook its cells."""
    global _shell, _world, _formatwarning
    from IPython import get_ipython

    _shell = get_ipython()
    if _shell is None:
        return
    _shell.user_ns.update(
        rank=spec.rank,
        world_size=spec.world_size,
        local_rank=spec.local_rank,
        device=device,
        torch=torch,
        dist=dist,
    )
    if not isinstance(_shell.compile._filename_map, _CellNumbers):
        _shell.compile._filename_map = _CellNumbers(_shell.compile._filename_map)
    _world = world
    _shell.events.register("pre_run_cell", _pre_run_cell)
    _shell.events.register("post_run_cell", _post_run_cell)
    if warnings.formatwarning is not _format_warning:
        _formatwarning, warnings.formatwarning = warnings.formatwarning, _format_warning
    _keep_requests_after_errors(getattr(_shell, "kernel", None))
    for name in ("ps1", "ps2"):
        if hasattr(sys, name):
            _prompts[name] = getattr(sys, name)
            delattr(sys, name)
    debug.install(world.store, spec.rank, cell_of_file, _shell)


def _keep_requests_after_errors(kernel: Any) -> None:
    """Make the engine run every cell it is sent, even right after a failed one.

    ipykernel drops the requests queued behind a cell that raised (`stop_on_error`), and goes on
    dropping until a callback of its own runs; the kernel's next cell can arrive in between and
    is lost (ipyparallel reports `TaskAborted`). distnb's cells do not depend on each other, so
    its engines treat every request as `stop_on_error=False`.
    """
    handlers = getattr(kernel, "shell_handlers", None)
    if not handlers or getattr(handlers.get("execute_request"), "_distnb", False):
        return
    original = handlers["execute_request"]

    async def execute_request(stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        parent["content"]["stop_on_error"] = False
        await original(stream, ident, parent)

    execute_request._distnb = True  # type: ignore[attr-defined]
    handlers["execute_request"] = execute_request


def unbind() -> None:
    """Take the cell hooks off; the namespace keeps its names."""
    global _world
    debug.uninstall()
    if _shell is not None:
        for event, hook in (("pre_run_cell", _pre_run_cell), ("post_run_cell", _post_run_cell)):
            with suppress(ValueError):
                _shell.events.unregister(event, hook)
    if warnings.formatwarning is _format_warning:
        warnings.formatwarning = _formatwarning
    for name, value in _prompts.items():
        setattr(sys, name, value)
    _prompts.clear()
    _world = None


def quiet_s() -> float | None:
    """How long since the last cell ended; None while one runs (the event loop runs other work
    while a cell awaits)."""
    return None if _cell_running else time.monotonic() - _cell_ended


def _pre_run_cell(info: Any) -> None:
    """Number this cell as the kernel numbered it, before IPython compiles it."""
    global _cell_running
    _cell_running = True
    if _world is None:
        return
    _world.restore()  # in case making it again failed at the end of the last cell
    # The session sets RUN before it makes ranks, so this get never waits.
    cell, run_id, check, stdin, everyone = keys.decode_run(_world.store.get(keys.RUN))
    # IPython has already taken this cell's number (and counted on by one) when this hook
    # runs; it compiles the cell right after, under the number taken.
    _shell.compile._filename_map.renumber[_shell.execution_count - 1] = cell
    checked.begin_run(run_id, cell_of_file)
    debug.begin_run(run_id, stdin, everyone)
    if not check:  # %%allranks --unchecked: this cell only, on every rank alike
        _cell_unchecked.append(checked.unchecked())
        _cell_unchecked[-1].__enter__()


def _post_run_cell(result: Any) -> None:
    global _cell_running, _cell_ended
    _cell_running, _cell_ended = False, time.monotonic()
    debug.end_run(result.error_in_exec)
    while _cell_unchecked:
        _cell_unchecked.pop().__exit__(None, None, None)
    if _world is not None:
        _world.restore()  # the cell's code destroyed the process group


class _CellNumbers(dict[str, int]):
    """IPython's map of cell filenames to cell numbers (`compile._filename_map`), storing the
    kernel's number instead of the engine's, so that tracebacks say `Cell In[7]` for the
    notebook's cell 7 (the engine counts only the cells it ran)."""

    def __init__(self, existing: dict[str, int]) -> None:
        super().__init__(existing)
        self.renumber: dict[int, int] = {}

    def __setitem__(self, filename: str, number: int) -> None:
        super().__setitem__(filename, self.renumber.pop(number, number))


def cell_of_file(filename: str) -> int | None:
    """The cell number IPython compiled `filename` for, or None for real files."""
    if _shell is None:
        return None
    number = _shell.compile._filename_map.get(filename)
    return int(number) if number is not None else None


def _format_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    line: str | None = None,
) -> str:
    """`warnings.formatwarning` naming a cell's line as the notebook does."""
    cell = cell_of_file(filename)
    if cell is None:
        return _formatwarning(message, category, filename, lineno, line)
    source = (line if line is not None else linecache.getline(filename, lineno)).strip()
    text = f"cell In[{cell}] line {lineno}: {category.__name__}: {message}\n"
    return text + (f"  {source}\n" if source else "")
