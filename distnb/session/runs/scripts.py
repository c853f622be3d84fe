"""A script run on every rank (`%dist_run train.py --lr 0.1`), as one cell of the session.

The script goes through the same machinery as a cell (`run.CellRun`): output per rank, the checked
runtime, the referee, timeouts, Ctrl-C and a dead rank are handled alike, and its errors are a
cell's errors. What differs is said here: the code the ranks run (`distnb.rank.scripts.run_main`,
which runs the file as `__main__`) and the name messages give the run (the script's, not the
cell's).
"""

from __future__ import annotations

import ast
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from distnb.errors import ConfigError
from distnb.records.cell import RankInfo
from distnb.session.runs.request import CellRequest
from distnb.userfiles import script_paths

__all__ = ["ScriptRequest", "script_request", "user_paths"]


@dataclass(frozen=True, slots=True)
class ScriptRequest(CellRequest):
    """A cell that runs a script; messages say `train.py failed on rank 1`, not `cell In[4]`."""

    script: str = ""

    @property
    def where(self) -> str:
        return self.script

    @property
    def noun(self) -> str:
        return f"the script {self.script}"


def script_request(
    path: str,
    args: str | Sequence[str],
    cell: int,
    run_id: int,
    targets: tuple[RankInfo, ...],
    check: bool,
    timeout: float | None,
) -> ScriptRequest:
    """The run of `path` with `args` (a command line, or its words) as cell `cell`, run
    `run_id`, on `targets`; the path and arguments are checked here, before any rank is asked."""
    full = _script_path(path)
    argv = [path, *_words(args)]
    code = f"{_LAUNCHER}{full!r}, {argv!r}, {os.getcwd()!r})"
    return ScriptRequest(cell, run_id, code, targets, check, timeout, script=path)


# The one line a script's run sends the ranks: `run_main(path, argv, cwd)`.
_LAUNCHER = "__import__('distnb.rank.scripts', fromlist=['run_main']).run_main("


def user_paths(code: str) -> tuple[str, ...]:
    """The user's paths (`distnb.userfiles.script_paths`) while the run of `code` runs: the
    script it launches and the folder beside it; `()` for a cell."""
    if not code.startswith(_LAUNCHER):
        return ()
    try:
        path, *_ = ast.literal_eval(code[len(_LAUNCHER) - 1 :])
    except (ValueError, SyntaxError):
        return ()
    return script_paths(path) if isinstance(path, str) else ()


def _script_path(path: str) -> str:
    """The script's absolute path, or a `ConfigError` that says what to give."""
    if not isinstance(path, str) or not path:
        raise ConfigError(f"give the path of a Python script, e.g. train.py; got {path!r}")
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(full):
        where = "is a folder" if os.path.isdir(full) else "does not exist"
        raise ConfigError(
            f"{full} {where}: give the path of a Python script, relative to the notebook's "
            f"working directory ({os.getcwd()}), e.g. %dist_run train.py --lr 0.1"
        )
    return full


def _words(args: str | Sequence[str]) -> list[str]:
    if isinstance(args, str):
        return shlex.split(args)
    words = list(args)
    bad = [w for w in words if not isinstance(w, str)]
    if bad:
        raise ConfigError(
            f"script arguments must be strings, got {bad!r}; e.g. args=['--lr', '0.1']"
        )
    return words
