"""What every board is (`Board`: stamped slots in rings), and what its two kinds share.

See the package's docstring for stamps, rings and `LAPPED`; `shm.ShmBoard` and
`store.StoreBoard` are the two kinds, and `wait.collect` reads them.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["LAPPED", "MAX_SLEEP_S", "MIN_SLEEP_S", "P2P_DEPTH", "Board", "backoff_s"]

# A slot whose writer has lapped the reader. Payloads are never empty, so b"" is free for this.
LAPPED = b""
P2P_DEPTH = 64

MIN_SLEEP_S = 50e-6  # polling without futexes: sleep, doubling up to MAX_SLEEP_S
MAX_SLEEP_S = 1e-3


def backoff_s(attempt: int, timeout_ns: int) -> float:
    """The sleep before poll `attempt`: doubling from MIN_SLEEP_S up to MAX_SLEEP_S (the exponent
    is capped: a wait of thousands of polls must not overflow a float)."""
    return min(timeout_ns / 1e9, MIN_SLEEP_S * 2.0 ** min(attempt, 32), MAX_SLEEP_S)


class Board(Protocol):
    """Stamped slots that `collect` reads; see the package's docstring."""

    def post(self, ring: int, stamp: int, payload: bytes) -> None: ...

    def read(self, ring: int, stamp: int) -> bytes | None: ...

    def block(self, ring: int, stamp: int, timeout_ns: int, attempt: int) -> None: ...

    def window(self) -> tuple[int, int]: ...

    def waited(self, ns: int) -> None: ...

    def retract(self, ring: int, stamp: int) -> None: ...

    def forget(self) -> None: ...

    def close(self, unlink: bool) -> None: ...
