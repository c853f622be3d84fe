"""Stopping inside a rank: `breakpoint()`, pdb, `input()` and post-mortem, answered in the notebook.

- `hooks`: `install` (at rank start) points every way into a debugger at `RankPdb`, and `input()`
  and `getpass` at the notebook; a cell's start and end (`begin_run`, `end_run`, `post_mortem`);
- `debugger`: `RankPdb`, pdb with its prompt in the notebook and the user's frames only;
- `ask`: a rank's stdin, a line typed in the notebook, asked for through the control plane;
- `stops`: when this rank sat stopped in a debugger, for the timeline;
- `mesh`: a stopped rank's place in its DeviceMesh, for commands to a slice of ranks;
- `visual`: the rank's side of JupyterLab's visual debugger (debugpy); `tensors`: tensors as its
  Variables panel shows them; `relay`: its connection carried over the control plane.
"""

from __future__ import annotations

from distnb.rank.debug.hooks import (
    Pdb,
    ask_input,
    ask_password,
    begin_run,
    breakpointhook,
    dist_breakpoint,
    end_run,
    install,
    post_mortem,
    set_trace,
    uninstall,
)

__all__ = [
    "Pdb",
    "ask_input",
    "ask_password",
    "begin_run",
    "breakpointhook",
    "dist_breakpoint",
    "end_run",
    "install",
    "post_mortem",
    "set_trace",
    "uninstall",
]
