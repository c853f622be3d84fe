"""`StoreBoard`: a board in the control plane's store, the path between hosts.

Each slot is a key (`<prefix>/<ring>/<slot>`, value = 8-byte stamp + payload); keys are reused,
so their number is bounded.

Off loopback the store is signed, and a stranger can overwrite a slot after its writer posted
it: the writer, gone on to the collective itself, would never post it again, and its readers
would wait for ever. So a signed board keeps what it posts (`distnb.contract.posts`), and a reader
that finds a forged slot asks its writer to post it again; a stamp that is already older or
newer than the one awaited reads as ever (not yet, or lapped), so a late copy is harmless. A
slot seen before and deleted since (`multi_get` waits for a missing key until the store's
timeout) is looked for again, and its writer asked for it the same way.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from typing import cast

from torch._C._distributed_c10d import Store
from torch.distributed import DistStoreError

from distnb.contract import keys, posts
from distnb.contract.signed import SignedStore
from distnb.rank.checked.exchange.board import LAPPED, backoff_s

__all__ = ["StoreBoard"]

_WIRE_STAMP = struct.Struct("<Q")  # in store values: fixed byte order, no alignment concerns


class StoreBoard:
    """A board in the control plane's store: works across hosts, one round trip per call."""

    def __init__(
        self, store: Store, prefix: str, depth: int, owners: Sequence[int] | None = None
    ) -> None:
        """`owners[ring]` is the rank that posts on `ring` (None: ring r is rank r's)."""
        self.store = store
        self.prefix = prefix
        self.depth = depth
        # Keys seen to exist: `multi_get` blocks on a missing key, so new keys are `check`ed first.
        self.known: set[str] = set()
        self.signed: SignedStore | None = store if isinstance(store, SignedStore) else None
        if self.signed is not None:
            posts.board_owners(prefix, owners)

    def key(self, ring: int, stamp: int) -> str:
        return keys.slot(self.prefix, ring, stamp % self.depth)

    def post(self, ring: int, stamp: int, payload: bytes) -> None:
        self._set(self.key(ring, stamp), _WIRE_STAMP.pack(stamp) + payload)

    def read(self, ring: int, stamp: int) -> bytes | None:
        return self.read_many([ring], stamp)[0]

    def read_many(self, rings: Sequence[int], stamp: int) -> list[bytes | None]:
        keys = [self.key(r, stamp) for r in rings]
        for k in keys:
            if k not in self.known and self.store.check([k]):
                self.known.add(k)
        present = [k for k in keys if k in self.known]
        values = self._values(present) if present else {}
        if self.signed is not None and self.signed.forged:
            posts.ask_again(self.store, self.signed.take_forged())
        out: list[bytes | None] = []
        for k in keys:
            value = values.get(k)
            if value is None or len(value) < _WIRE_STAMP.size:
                out.append(None)
                continue
            got = _WIRE_STAMP.unpack_from(value)[0]
            out.append(
                value[_WIRE_STAMP.size :] if got == stamp else LAPPED if got > stamp else None
            )
        return out

    def _values(self, present: list[str]) -> dict[str, bytes]:
        try:
            return dict(zip(present, self.store.multi_get(present), strict=True))
        except DistStoreError:  # a slot seen before is gone: something else deleted it
            self.known.difference_update(present)
            if self.signed is not None:
                posts.ask_again(self.store, present, gone=True)
            return {}

    def block(self, ring: int, stamp: int, timeout_ns: int, attempt: int) -> None:
        """Sleep a little before the next poll: each poll is a round trip to the store."""
        __tracebackhide__ = True  # a rank released from here shows the user's line, not this
        time.sleep(backoff_s(attempt, timeout_ns))

    def window(self) -> tuple[int, int]:
        return 0, 0  # a poll is a round trip: never spin

    def waited(self, ns: int) -> None:
        pass

    def retract(self, ring: int, stamp: int) -> None:
        self._set(self.key(ring, stamp), _WIRE_STAMP.pack(0))

    def _set(self, key: str, value: bytes) -> None:
        if self.signed is not None:
            posts.post(self.store, key, value)  # kept first: asked for again if forged
        else:
            self.store.set(key, _raw(value))

    def forget(self) -> None:
        pass  # store keys are reused, not created per exchange

    def close(self, unlink: bool) -> None:
        self.known.clear()


def _raw(value: bytes) -> str:
    # Store.set takes bytes as they are (pybind makes them a std::string); its stub says str.
    return cast(str, value)
