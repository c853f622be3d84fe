"""The interpreter's shared state a script may change: each part captured, made as a fresh
worker has it, and put back.

Swapped for a run (the join's value during it, the cells' after it): `os.environ`, `sys.path`,
warnings filters, logging's configuration, signal handlers (but SIGINT, which stays the cell's:
Ctrl-C must reach the run). Put back after a run (a run starts from the cells' value, which no
run can have changed): builtins, `sys`'s streams and hooks, the recursion limit.
"""

from __future__ import annotations

import builtins
import logging
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Mapping
from typing import Any, cast

__all__ = ["PARTS"]


class EnvironPart:
    """`os.environ`: torchrun's variables as distnb set them at the join, and nothing a script
    or library set since (Accelerate and transformers write their own variables)."""

    name = "environment variables"

    def capture(self) -> dict[str, str]:
        return dict(os.environ)

    def fresh(self, joined: dict[str, str]) -> None:
        self.restore(joined)

    def restore(self, saved: dict[str, str]) -> None:
        for name in [n for n in os.environ if n not in saved]:
            del os.environ[name]
        for name, value in saved.items():
            if os.environ.get(name) != value:
                os.environ[name] = value


class PathPart:
    """`sys.path` (the script's folder goes in front of the join's, in `scripts.run_main`)."""

    name = "sys.path"

    def capture(self) -> list[str]:
        return list(sys.path)

    def fresh(self, joined: list[str]) -> None:
        sys.path[:] = joined

    def restore(self, saved: list[str]) -> None:
        sys.path[:] = saved


class WarningsPart:
    """Warnings filters, and which warnings were shown once (a fresh process shows them again).
    `showwarning`, which a frontend may hook, is the cell's during a run and put back after."""

    name = "warnings filters"

    def capture(self) -> tuple[list[Any], Any]:
        return list(warnings.filters), warnings.showwarning

    def fresh(self, joined: tuple[list[Any], Any]) -> None:
        cast(list[Any], warnings.filters)[:] = joined[0]
        getattr(warnings, "onceregistry", {}).clear()
        _filters_changed()  # every module's record of warnings already shown is stale

    def restore(self, saved: tuple[list[Any], Any]) -> None:
        cast(list[Any], warnings.filters)[:] = saved[0]
        warnings.showwarning = saved[1]
        _filters_changed()


def _filters_changed() -> None:
    mutated: Callable[[], None] | None = getattr(warnings, "_filters_mutated", None)
    if mutated is None:  # Python 3.14 renamed it
        mutated = getattr(warnings, "_filters_mutated_lock_held", None)
    if mutated is not None:
        mutated()


# A logger's settings: level, handlers, filters, propagate, disabled.
LoggerState = tuple[int, list[Any], list[Any], bool, bool]
_NEW_LOGGER: LoggerState = (logging.NOTSET, [], [], True, False)


class LoggingPart:
    """Every logger's level, handlers, filters and flags (`logging.basicConfig` in a script, a
    library's verbosity), `logging.disable`, and `logging.captureWarnings`. Loggers made since
    are set back as new ones are: one object per name lives in `logging` for the whole process."""

    name = "logging configuration"

    def capture(self) -> tuple[dict[str, LoggerState], int, Any]:
        loggers = {"": _logger_state(logging.root)}
        for name, logger in list(logging.Logger.manager.loggerDict.items()):
            if isinstance(logger, logging.Logger):
                loggers[name] = _logger_state(logger)
        captured = getattr(logging, "_warnings_showwarning", None)
        return loggers, logging.root.manager.disable, captured

    def fresh(self, joined: tuple[dict[str, LoggerState], int, Any]) -> None:
        self.restore(joined)

    def restore(self, saved: tuple[dict[str, LoggerState], int, Any]) -> None:
        loggers, disabled, captured = saved
        changed = _set_logger(logging.root, loggers[""])
        for name, logger in list(logging.Logger.manager.loggerDict.items()):
            if isinstance(logger, logging.Logger):
                changed |= _set_logger(logger, loggers.get(name, _NEW_LOGGER))
        if changed or logging.root.manager.disable != disabled:
            logging.disable(disabled)  # also clears the loggers' cached levels
        logging._warnings_showwarning = captured  # type: ignore[attr-defined]


def _logger_state(logger: logging.Logger) -> LoggerState:
    return (
        logger.level,
        list(logger.handlers),
        list(logger.filters),
        logger.propagate,
        (logger.disabled),
    )


def _set_logger(logger: logging.Logger, state: LoggerState) -> bool:
    """Set `logger` to `state`; whether its level changed (its cached levels are stale then)."""
    level, handlers, filters, propagate, disabled = state
    changed = logger.level != level
    logger.level = level
    logger.handlers[:] = handlers
    logger.filters[:] = filters
    logger.propagate, logger.disabled = propagate, disabled
    return changed


class SignalsPart:
    """Handlers of every signal Python can set (SIGINT excepted when a run starts)."""

    name = "signal handlers"

    def capture(self) -> dict[int, Any]:
        handlers = {}
        for number in signal.valid_signals():
            if number in (signal.SIGKILL, signal.SIGSTOP):
                continue
            try:
                handler = signal.getsignal(number)
            except (OSError, ValueError):
                continue
            if handler is not None:  # None: set outside Python, which cannot be put back
                handlers[int(number)] = handler
        return handlers

    def fresh(self, joined: dict[int, Any]) -> None:
        self._set({n: h for n, h in joined.items() if n != signal.SIGINT})

    def restore(self, saved: dict[int, Any]) -> None:
        self._set(saved)

    @staticmethod
    def _set(handlers: Mapping[int, Any]) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread may set handlers; runs happen there
        for number, handler in handlers.items():
            if signal.getsignal(number) is not handler:
                signal.signal(number, handler)


class BuiltinsPart:
    """`builtins` (a library that replaces `print`): put back after a run."""

    name = "builtins"
    carried = False  # a run starts from the cells' (`reset.Part`)

    def capture(self) -> dict[str, Any]:
        return dict(vars(builtins))

    def fresh(self, joined: dict[str, Any]) -> None:
        """A run starts from the cells' builtins, as IPython set them for the cell."""

    def restore(self, saved: dict[str, Any]) -> None:
        space = vars(builtins)
        for name in [n for n in space if n not in saved]:
            del space[name]
        for name, value in saved.items():
            if space.get(name) is not value:
                space[name] = value


_SYS_HOOKS = ("stdin", "stdout", "stderr", "excepthook", "displayhook", "breakpointhook")


class SysPart:
    """`sys`'s streams and hooks, `threading.excepthook` and the recursion limit: put back
    after a run (during it they are the cell's: output, input and the debugger go through
    them)."""

    name = "sys streams and hooks"
    carried = False  # a run starts from the cells' (`reset.Part`)

    def capture(self) -> tuple[dict[str, Any], Any, int]:
        hooks = {name: getattr(sys, name, None) for name in _SYS_HOOKS}
        return hooks, threading.excepthook, sys.getrecursionlimit()

    def fresh(self, joined: tuple[dict[str, Any], Any, int]) -> None:
        """A run starts with the cell's streams and hooks."""

    def restore(self, saved: tuple[dict[str, Any], Any, int]) -> None:
        hooks, thread_hook, limit = saved
        for name, value in hooks.items():
            setattr(sys, name, value)
        threading.excepthook = thread_hook
        sys.setrecursionlimit(limit)


PARTS = (
    EnvironPart(),
    PathPart(),
    WarningsPart(),
    LoggingPart(),
    SignalsPart(),
    BuiltinsPart(),
    SysPart(),
)
