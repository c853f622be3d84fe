"""What tells a notebook from a script: there in the cells, gone while a script runs.

A rank is an IPython kernel, so in a cell the libraries that ask IPython see a notebook, as the
same code would in Jupyter. A torchrun worker is a plain `python script.py`, and libraries
decide from these signs how to behave: tqdm.auto, transformers and Accelerate look for IPython's
kernel app in `get_ipython().config` (widget bars, notebook launchers); rich looks for
`get_ipython` among the builtins; code that calls `exit()` needs Python's own (IPython hides it).
While a `%dist_run` script runs, each probe answers as in a torchrun worker, and the cells get
theirs back after: `get_ipython`, `__IPYTHON__` and `display` are not builtins;
`IPython.get_ipython()` is None (a cell's: the rank's shell); `exit` and `quit` are Python's;
`sys.ps1` and `sys.ps2`, which a rank never has (`distnb.rank.shell`), are gone if a cell set
them. The guide's table (docs/guide/scripts.md) lists every probe. Already a worker's in
both: `sys.flags.interactive` (0) and `__main__` (the script's module, with its `__file__`:
`distnb.rank.scripts`). distnb's own code keeps the rank's shell, which it holds
(`distnb.rank.shell`) rather than finds through IPython.
"""

from __future__ import annotations

import builtins
import sys
from typing import Any

__all__ = ["NotebookPart"]

# What IPython adds to the builtins of a shell's process.
_IPYTHON_BUILTINS = ("get_ipython", "__IPYTHON__", "display")


class NotebookPart:
    """`sys.ps1`/`ps2`, IPython's builtins, Python's `exit`/`quit`, IPython's current shell."""

    name = "notebook's signs"
    carried = False  # a run starts with the signs gone, whatever it is given (`reset.Part`)

    def capture(self) -> tuple[dict[str, Any], dict[str, Any], list[tuple[type, Any]]]:
        prompts = {name: getattr(sys, name) for name in ("ps1", "ps2") if hasattr(sys, name)}
        space = vars(builtins)
        names = {n: space[n] for n in (*_IPYTHON_BUILTINS, "exit", "quit") if n in space}
        return prompts, names, _shells()

    def fresh(self, joined: Any) -> None:
        for name in ("ps1", "ps2"):
            if hasattr(sys, name):
                delattr(sys, name)
        space = vars(builtins)
        for name in _IPYTHON_BUILTINS:
            space.pop(name, None)
        import site

        site.setquit()  # exit() and quit() as Python's site module sets them
        for cls, _ in _shells():
            cls._instance = None  # type: ignore[attr-defined]

    def restore(self, saved: tuple[dict[str, Any], dict[str, Any], list[tuple[type, Any]]]) -> None:
        prompts, names, shells = saved
        for name, value in prompts.items():
            setattr(sys, name, value)
        space = vars(builtins)
        for name in (*_IPYTHON_BUILTINS, "exit", "quit"):
            space.pop(name, None)
        space.update(names)
        for cls, instance in shells:
            cls._instance = instance  # type: ignore[attr-defined]


def _shells() -> list[tuple[type, Any]]:
    """Each class of IPython's current shell that holds it as its singleton, with it: what
    `IPython.get_ipython()` finds (nothing where IPython is not imported)."""
    core = sys.modules.get("IPython.core.interactiveshell")
    if core is None:
        return []
    shell_class: Any = core.InteractiveShell
    instance = shell_class._instance if shell_class.initialized() else None
    if instance is None:
        return []
    return [
        (cls, instance) for cls in type(instance).__mro__ if vars(cls).get("_instance") is instance
    ]
