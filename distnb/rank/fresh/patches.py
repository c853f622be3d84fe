"""What libraries patch in the namespaces the process keeps: `torch.compile`, `Tensor` methods,
`logging.Logger`.

Libraries set names in torch and the standard library as they are imported: Lightning wraps
`torch.compile` to capture its arguments, transformers adds `warning_once` and `info_once` to
`logging.Logger`. A torchrun worker makes each patch once, on torch's own function. A run imports
the library afresh while torch stays loaded, so each run wrapped the wrapper the run before had
left (and kept, through it, that run's whole Lightning), and the cells saw the last run's.

Here a name in those namespaces is judged by who made its value (a function's module, where
`functools.wraps` leaves the wrapped function's `__module__`; a class's module): a value made by
a module the process keeps is the process's (torch's dynamo wraps `torch.manual_seed` once, for
good) and stays; one made by any other module is the run's or the cells'. So a run starts with
the join's values in place of the cells' patches, and at its end its own patches give way to the
cells' (a name the cells did not have is taken out).
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["PatchesPart"]

Names = tuple[dict[str, Any], ...]  # each namespace of `_spaces()`: its names
_ABSENT = object()


def _spaces() -> tuple[Any, ...]:
    return (torch, torch.Tensor, torch.nn.Module, logging.Logger)


class PatchesPart:
    """The names of `_spaces()`: the join's for a run, the cells' put back after it."""

    name = "names patched into torch and logging"

    def __init__(self, kept: Callable[[str], bool]) -> None:
        self._kept = kept  # whether a module (by name) is the process's

    def capture(self) -> Names:
        return tuple(dict(vars(space)) for space in _spaces())

    def fresh(self, joined: Names) -> None:
        self._set(joined)

    def restore(self, saved: Names) -> None:
        self._set(saved)

    def _set(self, names: Names) -> None:
        """Where a name's value differs from `names`, put the one in `names` back (or take the
        name out), unless both were made by what the process keeps."""
        for space, wanted in zip(_spaces(), names, strict=True):
            for name, value in list(vars(space).items()):
                before = wanted.get(name, _ABSENT)
                if value is before or (
                    self._the_process_s(value)
                    and (before is _ABSENT or self._the_process_s(before))
                ):
                    continue  # the process's own, made for good
                if before is _ABSENT:
                    delattr(space, name)
                else:
                    setattr(space, name, before)
            for name, before in wanted.items():
                if name not in vars(space):
                    setattr(space, name, before)

    def _the_process_s(self, value: Any) -> bool:
        """Whether `value` was made by a module the process keeps (a module object always is:
        a submodule, imported once per process), not by a script or a cell (`__main__`)."""
        if isinstance(value, types.ModuleType):
            return True
        maker = _maker(value)
        return maker is None or (maker != "__main__" and self._kept(maker))


def _maker(value: Any) -> str | None:
    """The name of the module whose code made `value`, where it says."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, property):
        value = value.fget
    if isinstance(value, types.FunctionType):
        name = value.__globals__.get("__name__")  # `wraps` copies `__module__`, not this
        return name if isinstance(name, str) else None
    if isinstance(value, type):
        return value.__module__
    return None
