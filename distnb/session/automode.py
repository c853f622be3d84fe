"""Auto mode: every cell runs on the ranks, as if it started with `%%allranks`, until turned off.

Like ipyparallel's `%autopx`, but through IPython's documented hook for rewriting input: an
input transformer (`shell.input_transformers_cleanup`) turns each cell into `%%dist_auto` +
the cell (a cell magic the mode registers itself), so history, execution counts, tracebacks
(`Cell In[7], line 1`, the cell's own line numbers) and Ctrl-C work as for any cell, in a
Jupyter kernel and in terminal IPython alike.

Cells that stay in the kernel (`route`): a cell starting with `%%local` (the line is dropped, so
the cell is ordinary kernel code), any other cell magic (`%%allranks --ranks 0`, `%%time`),
distnb's own magics (`%dist_auto off`, `%dist_status`), extension loading, and `exit`/`quit`.

Where code runs is always visible: in terminal IPython the prompt reads `[ranks 0-1] In [5]:`;
in Jupyter, turning the mode on or off prints a banner and each cell it sends to the ranks
starts with a one-line marker, besides the `[rank N]` labels of their output.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import TYPE_CHECKING, Any

from distnb.errors import SessionError
from distnb.ranklist import RankArg, format_ranks
from distnb.session.options import check_timeout

if TYPE_CHECKING:
    from distnb.session.runs.request import CellResult
    from distnb.session.surface import SessionSurface

__all__ = ["AutoMode", "Route", "auto", "route"]

_LOCAL = re.compile(r"%%local\b")
_KERNEL = re.compile(r"%%|%(dist_|load_ext|unload_ext|reload_ext)|(exit|quit)\s*(\(\s*\))?\s*$")


class Route(str, Enum):
    RANKS = "ranks"
    KERNEL = "kernel"
    LOCAL = "local"  # a `%%local` cell: kernel code once its first line is dropped


def route(lines: list[str]) -> Route:
    """Where a cell runs in auto mode, by its first non-blank line."""
    first = next((line.strip() for line in lines if line.strip()), "")
    if not first:
        return Route.KERNEL
    if _LOCAL.match(first):
        return Route.LOCAL
    return Route.KERNEL if _KERNEL.match(first) else Route.RANKS


class AutoMode:
    """The input transformer of one IPython shell, and the mode's state.

    Installed once per shell (`AutoMode.of(shell)`) and kept when the mode is off, so that
    `%%local` cells always run as plain kernel code.
    """

    # IPython's completeness check (Enter in a terminal) skips transformers with side effects:
    # it must see the cell as typed, not as one `run_cell_magic` call, which is always complete.
    has_side_effects = True

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.session: SessionSurface | None = None
        self.ranks: RankArg | None = None
        self.timeout: float | None = None
        self.check = True
        self.label = ""
        self._prompts: Any = None

    @classmethod
    def find(cls, shell: Any) -> AutoMode | None:
        return next((t for t in shell.input_transformers_cleanup if isinstance(t, cls)), None)

    @classmethod
    def of(cls, shell: Any) -> AutoMode:
        """The shell's auto mode, installed on first use with the `%%dist_auto` cell magic that
        the transformed cells call."""
        mode = cls.find(shell)
        if mode is None:
            mode = cls(shell)
            shell.input_transformers_cleanup.append(mode)
            shell.register_magic_function(mode.cell_magic, "cell", "dist_auto")
        return mode

    def uninstall(self) -> None:
        self.disable()
        self.shell.input_transformers_cleanup.remove(self)
        self.shell.magics_manager.magics["cell"].pop("dist_auto", None)

    @property
    def active(self) -> bool:
        return self.session is not None

    def __call__(self, lines: list[str]) -> list[str]:
        where = route(lines)
        if where is Route.LOCAL:
            first = next(i for i, line in enumerate(lines) if line.strip())
            return [*lines[:first], "# %%local\n", *lines[first + 1 :]]
        if where is Route.RANKS and self.active:
            return ["%%dist_auto\n", *lines]
        return lines

    def enable(
        self, session: SessionSurface, ranks: RankArg | None, timeout: float | None, check: bool
    ) -> None:
        self.session, self.ranks, self.timeout, self.check = session, ranks, timeout, check
        self.label = format_ranks(t.rank for t in session.targets(ranks))
        self._show_in_prompt()
        print(
            f"distnb: auto mode on: every cell runs on {self.label}, as with %%allranks. "
            "Start a cell with %%local to run it here; %dist_auto off ends the mode."
        )

    def disable(self) -> None:
        was = self.active
        self.session = None
        self._restore_prompt()
        if was:
            print("distnb: auto mode off: cells run in the kernel again.")

    def cell_magic(self, line: str, cell: str) -> None:
        """`%%dist_auto`, which the transformer writes: the cell on the mode's ranks, marked as
        such in Jupyter, its views and a mismatch's table shown."""
        from distnb.views.display import in_kernel, shown
        from distnb.views.status import show_where

        if in_kernel():
            show_where(self.label if self.active else "all ranks")
        shown(lambda: self.run(cell))

    def run(self, cell: str) -> CellResult:
        """Run one cell on the mode's ranks."""
        session = self.session
        if session is None:
            raise SessionError("auto mode is off: turn it on with %dist_auto on")
        if not session.running:
            self.disable()
            raise SessionError(
                "auto mode ended, since its session has stopped, and this cell ran nowhere: run "
                "it again to run it in the kernel, or %dist_start then %dist_auto on."
            )
        return session.run(cell, ranks=self.ranks, timeout=self.timeout, check=self.check)

    def _show_in_prompt(self) -> None:
        """Terminal IPython: `[ranks 0-1] In [5]:`. Jupyter draws its prompts itself."""
        current = getattr(self.shell, "prompts", None)
        if current is None:
            return
        from distnb.views.prompts import ranks_prompts

        inner = self._prompts if self._prompts is not None else current
        self._prompts = inner
        self.shell.prompts = ranks_prompts(self.shell, inner, self.label)

    def _restore_prompt(self) -> None:
        if self._prompts is not None:
            self.shell.prompts = self._prompts
            self._prompts = None


def auto(
    session: SessionSurface,
    on: bool = True,
    ranks: RankArg | None = None,
    timeout: float | None = None,
    check: bool = True,
) -> None:
    """Auto mode: from the next cell on, every cell runs on the ranks until `auto(False)`.

    >>> s.auto()            # %dist_auto on
    distnb: auto mode on: every cell runs on ranks 0-1, ...
    >>> s.auto(False)       # %dist_auto off

    `ranks`, `timeout` and `check` are `run`'s. A cell starting with `%%local` runs in the
    kernel meanwhile, as do cell magics and distnb's own magics (`%dist_status`).
    """
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        raise SessionError("auto mode rewrites IPython cells: use it in Jupyter or IPython")
    mode = AutoMode.of(shell)
    if not on:
        mode.disable()
        return
    session.require_running()
    check_timeout(timeout)
    session.targets(ranks)  # ConfigError for ranks not in the session
    mode.enable(session, ranks, timeout, check)
