"""The `atexit` handlers a run registers run when it ends, as a torchrun worker's run when its
process ends.

During a run `atexit.register` and `atexit.unregister` are distnb's, which note what the run
registers, and from which module, and pass it on. At the run's end, each handler registered by
the script (`__main__`) or by a module the run imported afresh (taken out after it, `modules`)
runs, the last registered first, and is unregistered: a user's `atexit.register(save_results)`
or `atexit.register(print, "done")` runs as the script ends, and a library imported afresh
(huggingface_hub's HTTP session) closes what it opened and no longer holds its module, and all
it reaches, for the process's life. A handler that raises is printed as Python prints it at
exit, and the others run. Handlers registered by what the process keeps (torch, the standard
library, compiled packages) stay registered for the process's exit.
"""

from __future__ import annotations

import atexit
import sys
import traceback
from collections.abc import Callable, Collection
from typing import Any

__all__ = ["RunExits"]

_register, _unregister = atexit.register, atexit.unregister

# who registered it (a module's name), the handler, its arguments
Handler = tuple[str, Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class RunExits:
    """See the module: `start` as a run starts, `end` as it ends."""

    def __init__(self) -> None:
        self._handlers: list[Handler] = []

    def start(self) -> None:
        self._handlers = []
        atexit.register, atexit.unregister = self._register, self._unregister  # type: ignore[assignment]

    def end(self, dropped: Collection[str]) -> None:
        """Put `atexit` back; run and unregister the handlers registered by `__main__` and by
        `dropped` (the modules the run imported, now taken out)."""
        atexit.register, atexit.unregister = _register, _unregister
        handlers, self._handlers = self._handlers, []
        for module, func, args, kwargs in reversed(handlers):
            if module != "__main__" and module not in dropped:
                continue
            _unregister(func)
            try:
                func(*args, **kwargs)
            except BaseException:  # as at exit: said, and the others run
                print(f"Exception ignored in atexit callback {func!r}:", file=sys.stderr)
                traceback.print_exc()

    def _register(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        module = sys._getframe(1).f_globals.get("__name__", "")
        self._handlers.append((module, func, args, kwargs))
        return _register(func, *args, **kwargs)

    def _unregister(self, func: Callable[..., Any]) -> None:
        self._handlers = [h for h in self._handlers if h[1] != func]
        _unregister(func)
