"""What a run is asked to do, and what it did: a cell's request and result."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from distnb.records.cell import RankFailure, RankInfo
from distnb.views.output import RankOutput

__all__ = ["CellRequest", "CellResult", "assigned_names", "notebook_cell"]


@dataclass(frozen=True, slots=True)
class CellRequest:
    """One cell to run: its notebook number, the session's run id, where and how."""

    cell: int
    run_id: int
    code: str
    targets: tuple[RankInfo, ...]
    check: bool = True
    timeout: float | None = None
    everyone: bool = True  # every rank of the world runs it (not `--ranks`)

    @property
    def where(self) -> str:
        return f"cell In[{self.cell}]"

    @property
    def noun(self) -> str:
        """What a rank finishes: `the cell` (`the script` for a script)."""
        return "the cell"


@dataclass(frozen=True, slots=True)
class CellResult:
    """What a cell did on each rank: its output in rank order, and the ranks' failures.

    `views` holds what the caller asked to see after the cell (shape table, timeline).
    """

    cell: int
    run_id: int
    outputs: tuple[RankOutput, ...]
    failures: tuple[RankFailure, ...] = ()
    views: tuple[Any, ...] = ()

    def stdout(self, rank: int) -> str:
        return next(o.stdout for o in self.outputs if o.rank == rank)

    def result(self, rank: int) -> str | None:
        """The rank's last-expression value as text, if the cell ended with one."""
        out = next(o for o in self.outputs if o.rank == rank)
        for content in reversed(out.displays):
            if content.get("execute_result"):
                return str(content.get("data", {}).get("text/plain"))
        return None


def assigned_names(code: str) -> list[str]:
    """Top-level names a cell binds (`x = ...`, `for x in`, `with ... as x`, `def x`), in order."""
    import ast

    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    names: dict[str, None] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names[node.id] = None
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = None
    return list(names)


def notebook_cell(fallback: int) -> int:
    """The notebook's number for the running cell (`fallback` outside IPython)."""
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        return fallback
    # While a cell runs, IPython has already counted on to the next number; the running
    # cell's own number is on its result.
    running = getattr(shell.displayhook, "exec_result", None)
    return int(running.execution_count if running is not None else shell.execution_count)
