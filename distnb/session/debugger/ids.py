"""How ranks' threads, frames and variables reach JupyterLab's debugger under ids of their own.

Id `i` of rank `r` is `(r + 1) << 32 | i` (ipykernel's own ids are small): a request naming such
an id goes to that rank, with the rank's own id; every other request is ipykernel's.
"""

from __future__ import annotations

__all__ = ["RESUMING", "ROUTED", "decode", "encode"]

_SHIFT = 32
# the argument of each request that names a thread, frame or variable
ROUTED = {
    "stackTrace": "threadId",
    "continue": "threadId",
    "next": "threadId",
    "stepIn": "threadId",
    "stepOut": "threadId",
    "pause": "threadId",
    "scopes": "frameId",
    "evaluate": "frameId",
    "setExpression": "frameId",
    "variables": "variablesReference",
    "setVariable": "variablesReference",
}
RESUMING = {"continue", "next", "stepIn", "stepOut"}


def encode(rank: int, own: int) -> int:
    return ((rank + 1) << _SHIFT) | own


def decode(value: int) -> tuple[int | None, int]:
    """(rank, the rank's own id), or (None, value) for one of the kernel's own."""
    if value >> _SHIFT:
        return (value >> _SHIFT) - 1, value & ((1 << _SHIFT) - 1)
    return None, value


def kernels(value: int) -> bool:
    """Whether an id is one of the kernel's own (not a rank's)."""
    return value >> _SHIFT == 0
