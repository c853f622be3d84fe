"""Parsing magics' arguments: whole numbers, seconds, rank lists, sizes; each bad value a
`UsageError` that says what to type."""

from __future__ import annotations

import shlex
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import parse_argstring

from distnb.errors import ConfigError
from distnb.session.data import parse_size

__all__ = ["parse", "parse_command_line", "rank_list", "seconds", "size", "whole"]


def parse(magic: Any, line: str) -> Any:
    try:
        return parse_argstring(magic, line)
    except UsageError as exc:
        name = magic.__name__
        raise UsageError(f"{exc}\nUsage: %{name} {_usage(magic)} (see %{name}?)") from None


def _usage(magic: Any) -> str:
    return (magic.parser.format_usage() or "  ").split(" ", 2)[-1].strip()


def whole(text: str, flag: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{flag} takes a whole number, got {text!r}; e.g. {flag} 2") from None
    if value < 1:
        raise UsageError(f"{flag} must be at least 1, got {value}; e.g. {flag} 2")
    return value


def seconds(text: str | None, flag: str = "--timeout") -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{flag} takes seconds, got {text!r}; e.g. {flag} 30") from None
    if not value > 0:
        raise UsageError(f"{flag} must be > 0 seconds, got {text}; e.g. {flag} 30")
    return value


def rank_list(text: str) -> list[int]:
    try:
        return [int(part) for part in shlex.split(text.replace(",", " "))]
    except ValueError:
        raise UsageError(
            f"--ranks takes comma-separated ranks, got {text!r}; e.g. --ranks 0,1"
        ) from None


def parse_command_line(magic: Any, line: str) -> Any:
    """`parse`, split as a shell splits (a script's `'two words'` arrives as `two words`)."""
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"{exc} in {line!r}: close the quote") from None
    try:
        return magic.parser.parse_args(words)
    except UsageError as exc:
        name = magic.__name__
        raise UsageError(f"{exc}\nUsage: %{name} {_usage(magic)} (see %{name}?)") from None


def size(text: str | None) -> int | None:
    try:
        return parse_size(text) if text is not None else None
    except ConfigError as exc:
        raise UsageError(f"--limit: {exc}") from None
