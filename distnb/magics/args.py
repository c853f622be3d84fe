"""Parsing magics' arguments: whole numbers, seconds, rank lists, sizes; each bad value a
`UsageError` that says what to type. Rank lists are `distnb.ranklist`'s grammar (`0-3,6`,
`all`, `ranks 0-2,5`), the one the debugger's `ranks 0-3 CMD` and Python's `ranks=` read."""

from __future__ import annotations

import shlex
from typing import Any

from IPython.core.error import UsageError

from distnb.errors import ConfigError
from distnb.ranklist import rank_arg
from distnb.session.data import parse_size

__all__ = ["numbers", "parse", "rank_list", "seconds", "size", "whole"]


def parse(magic: Any, line: str) -> Any:
    """`line` split as a shell splits it (`--if "i == 40"` is `i == 40`, without its quotes:
    IPython's own `parse_argstring` keeps them), then read by the magic's argument parser."""
    name = magic.__name__
    try:
        argv = shlex.split(line)
    except ValueError as exc:  # "No closing quotation"
        raise UsageError(f"%{name} {line}: {exc}; close the quote, or escape it") from None
    try:
        return magic.parser.parse_args(argv)
    except UsageError as exc:
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


def rank_list(text: str | None) -> list[int] | None:
    """`--ranks 0-3,6` (or `0,2`, `"ranks 0-2,5"`): the ranks; None for every rank (`all`, or
    no `--ranks`)."""
    if text is None:
        return None
    try:
        return rank_arg(text)
    except ValueError as exc:
        raise UsageError(f"--ranks: {exc}") from None


def numbers(text: str, flag: str) -> list[int]:
    """`1,3` or `1 3`: whole numbers, as `--trace-batches` takes them."""
    try:
        return [int(part) for part in shlex.split(text.replace(",", " "))]
    except ValueError:
        raise UsageError(
            f"{flag} takes comma-separated whole numbers, got {text!r}; e.g. {flag} 1,3"
        ) from None


def size(text: str | None) -> int | None:
    try:
        return parse_size(text) if text is not None else None
    except ConfigError as exc:
        raise UsageError(f"--limit: {exc}") from None
