"""The interpreter hooks a run registers, which have no place in a process that goes on: its
`atexit` handlers, run when it ends as a torchrun worker's run when its process ends, and its
fork handlers, called for forks made during the run only.

During a run `atexit.register`, `atexit.unregister` and `os.register_at_fork` are distnb's,
which note who registers (the calling module's name). Handlers registered by the script
(`__main__`) or by a module the run imports afresh (`modules`) belong to the run:

- at its end, its `atexit` handlers run, the last registered first, and are unregistered: a
  user's `atexit.register(save_results)` or `atexit.register(print, "done")` runs as the script
  ends. A handler that raises is printed as Python prints it at exit, and the others run;
- its fork handlers are kept in a list of the run's, called (as Python calls them: `before`
  the last registered first, the others in order) by three handlers of distnb's own that the
  process registers once; the list is emptied at the run's end. (Python has no way to take a
  fork handler back: one registered as such would be called at every later fork.)

Neither is left holding the run's modules, and all they reach, for the process's life
(huggingface_hub registers both for its HTTP session). Hooks registered by what the process
keeps (torch, the standard library, compiled packages) stay: `atexit` handlers as registered,
fork handlers registered for good as the run ends (whether a module stays is known then: a
package is found compiled as its extension loads).
"""

from __future__ import annotations

import atexit
import os
import sys
import traceback
from collections.abc import Callable, Collection, Iterable
from typing import Any

__all__ = ["RunHooks"]

_register, _unregister = atexit.register, atexit.unregister
_register_at_fork = os.register_at_fork

# who registered it (a module's name), the handler, its arguments
Exit = tuple[str, Callable[..., Any], tuple[Any, ...], dict[str, Any]]
# who registered it, and its handlers by name: before, after_in_child, after_in_parent
Fork = tuple[str, dict[str, Callable[[], Any]]]
Aside = tuple[list[Exit], list[Fork]]  # a run's hooks, set aside for a later run


class RunHooks:
    """See the module: `start` as a run starts, `end` as it ends."""

    def __init__(self) -> None:
        self._exits: list[Exit] = []
        self._forks: list[Fork] = []
        self._dispatching = False  # distnb's three fork handlers are registered

    def start(self, carried: Aside | None = None) -> None:
        """Note the hooks registered from here on; `carried`: those set aside before (`set_aside`),
        as if registered in this run."""
        self._exits, self._forks = (
            ([], []) if carried is None else (list(carried[0]), list(carried[1]))
        )
        atexit.register, atexit.unregister = self._register, self._unregister  # type: ignore[assignment]
        os.register_at_fork = self._register_at_fork

    def end(self, dropped: Collection[str]) -> None:
        """Put the hooks' functions back. Of the handlers registered by `__main__` and by
        `dropped` (the modules the run imported, to be taken out), run and unregister the
        `atexit` ones and forget the fork ones; register the others' fork handlers for good
        (the module that registered them stays loaded)."""
        atexit.register, atexit.unregister = _register, _unregister
        os.register_at_fork = _register_at_fork

        def the_run_s(module: str) -> bool:
            return module == "__main__" or module in dropped

        forks, self._forks = self._forks, []
        for module, handlers in forks:
            if not the_run_s(module):
                _register_at_fork(**handlers)
        exits, self._exits = self._exits, []
        for module, func, args, kwargs in reversed(exits):
            if not the_run_s(module):
                continue
            _unregister(func)
            try:
                func(*args, **kwargs)
            except BaseException:  # as at exit: said, and the others run
                print(f"Exception ignored in atexit callback {func!r}:", file=sys.stderr)
                traceback.print_exc()

    def set_aside(self) -> Aside:
        """The hooks registered so far, which the run's `end` then leaves: a later run carries
        them (`start`), or they end with their modules (`end` after `start(carried)`)."""
        aside: Aside = (self._exits, self._forks)
        self._exits, self._forks = [], []
        return aside

    def _register(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        module = sys._getframe(1).f_globals.get("__name__", "")
        self._exits.append((module, func, args, kwargs))
        return _register(func, *args, **kwargs)

    def _unregister(self, func: Callable[..., Any]) -> None:
        self._exits = [h for h in self._exits if h[1] != func]
        _unregister(func)

    def _register_at_fork(
        self,
        *,
        before: Callable[[], Any] | None = None,
        after_in_child: Callable[[], Any] | None = None,
        after_in_parent: Callable[[], Any] | None = None,
    ) -> None:
        module = sys._getframe(1).f_globals.get("__name__", "")
        given = {
            name: handler
            for name, handler in (
                ("before", before),
                ("after_in_child", after_in_child),
                ("after_in_parent", after_in_parent),
            )
            if handler is not None
        }
        if not given:
            raise TypeError("At least one argument is required.")
        for name, handler in given.items():
            if not callable(handler):
                raise TypeError(f"'{name}' must be callable, not {type(handler).__name__}")
        if not self._dispatching:
            _register_at_fork(
                before=self._before, after_in_child=self._in_child, after_in_parent=self._in_parent
            )
            self._dispatching = True
        self._forks.append((module, given))

    def _before(self) -> None:
        _call(h.get("before") for _, h in reversed(self._forks))

    def _in_child(self) -> None:
        _call(h.get("after_in_child") for _, h in self._forks)

    def _in_parent(self) -> None:
        _call(h.get("after_in_parent") for _, h in self._forks)


def _call(handlers: Iterable[Callable[[], Any] | None]) -> None:
    """Each handler, as Python calls fork handlers: one that raises is said, the others run."""
    for handler in list(handlers):  # a handler may register another
        if handler is None:
            continue
        try:
            handler()
        except Exception:
            print(f"Exception ignored in fork handler {handler!r}:", file=sys.stderr)
            traceback.print_exc()
