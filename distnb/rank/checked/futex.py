"""Blocking waits on a 32-bit word in shared memory: Linux futexes, through ctypes.

A rank waiting for its peers' fingerprints must not spin for long: on a machine with as many
ranks as cores, a spinning rank takes the CPU its peer (or gloo's threads) needs.
`distnb.rank.checked.exchange.collect` polls only in a short window around when it expects the post,
and sleeps here otherwise.
`wait` sleeps in the kernel until a `wake` on the same word (the writer's post) or the timeout;
the caller re-checks what it waits for either way. `AVAILABLE` is False off Linux
x86-64/aarch64: callers then poll with sleeps.
"""

from __future__ import annotations

import ctypes
import platform
import sys

__all__ = ["AVAILABLE", "wait", "wake"]

_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine())
_FUTEX_WAIT = 0
_FUTEX_WAKE = 1
_WAKE_ALL = 0x7FFFFFFF


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux") or _SYS_FUTEX is None:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # CDLL calls release the GIL while blocked
        libc.syscall.restype = ctypes.c_long
        return libc
    except OSError:
        return None


_libc = _load()
AVAILABLE = _libc is not None


def wait(address: int, expected: int, timeout_ns: int) -> None:
    """Sleep while the int32 at `address` equals `expected`, at most `timeout_ns`.

    Returns on a `wake`, a changed value, the timeout or a signal (Python then raises
    KeyboardInterrupt at its next instruction); callers re-check their condition.
    """
    __tracebackhide__ = True  # a rank released from here shows the user's line, not this
    assert _libc is not None
    ts = _Timespec(timeout_ns // 1_000_000_000, timeout_ns % 1_000_000_000)
    _libc.syscall(
        _SYS_FUTEX,
        ctypes.c_void_p(address),
        _FUTEX_WAIT,
        ctypes.c_int(expected),
        ctypes.byref(ts),
        None,
        0,
    )


def wake(address: int) -> None:
    """Wake every process sleeping on the int32 at `address` (about a microsecond if none)."""
    assert _libc is not None
    _libc.syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAKE, _WAKE_ALL, None, None, 0)
