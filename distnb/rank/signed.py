"""The control plane's store, signed: what the kernel and the ranks post carries a tag that only
holders of the session's secret can make, and nothing read without a valid tag is used.

torch's TCPStore has no authentication: anyone who reaches its port can list, read, write and
delete keys. On loopback that is this machine's users only; once the control plane listens on a
network (ranks on other hosts), distnb signs it. Each value is stored as a 16-byte tag (HMAC-
SHA256 of the key and the value, truncated) followed by the value. The secret is made by the
kernel per session and reaches the ranks in their `RankSpec`, through ipyparallel's own signed
messages, never through the store.

A value whose tag does not verify is treated as not there yet: `check` says False, `get` and
`wait` wait for a valid one (up to the store's timeout), `multi_get` gives `b""` for it (boards
read that as "not posted", beacon readers skip it). So a stranger can delay the session or make
it time out by overwriting keys (the store cannot stop that), but cannot make a rank or the
kernel decode, believe or run anything it wrote. Counters (`add`) are plain integers, read by
the kernel only as counts of keys it then verifies.

The process group's own rendezvous goes through the same store (gloo's and NCCL's addresses),
so it is signed too. Libraries that rendezvous through `MASTER_ADDR`/`MASTER_PORT` themselves
(torch's `env://`) talk to the raw store, as they would under torchrun.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import cast

import torch.distributed as dist

__all__ = ["TAG_BYTES", "SignedStore"]

TAG_BYTES = 16
_POLL_S = 0.01  # between reads of a key that holds a value not signed by the session


class SignedStore(dist.Store):
    """`inner` with every value signed with `secret` (see the module)."""

    def __init__(self, inner: dist.Store, secret: bytes, timeout_s: float = 30.0) -> None:
        super().__init__()
        self._inner, self._secret, self._timeout_s = inner, secret, timeout_s

    def _tag(self, key: str, value: bytes) -> bytes:
        return hmac.digest(self._secret, key.encode() + b"\0" + value, "sha256")[:TAG_BYTES]

    def _sealed(self, key: str, value: str | bytes) -> bytes:
        data = value.encode() if isinstance(value, str) else bytes(value)
        return self._tag(key, data) + data

    def _opened(self, key: str, raw: bytes) -> bytes | None:
        """The value, if its tag verifies."""
        value = raw[TAG_BYTES:]
        if len(raw) < TAG_BYTES or not hmac.compare_digest(raw[:TAG_BYTES], self._tag(key, value)):
            return None
        return value

    def _valid(self, key: str, timeout_s: float) -> bytes:
        """The key's value once it is one the session signed (waiting while it is not)."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self._opened(key, self._inner.get(key))
            if value is not None:
                return value
            if time.monotonic() >= deadline:
                raise dist.DistStoreError(
                    f"distnb's control plane: key {key!r} holds a value the session did not sign "
                    f"(written by something else that reached the store) for {timeout_s:g} s"
                )
            time.sleep(_POLL_S)

    # --- the Store interface ---------------------------------------------------------------

    def set(self, key: str, value: str | bytes) -> None:
        self._inner.set(key, cast(str, self._sealed(key, value)))  # bytes pass as they are

    def get(self, key: str) -> bytes:
        return self._valid(key, self._timeout_s)

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        raws = self._inner.multi_get(list(keys))
        return [self._opened(k, raw) or b"" for k, raw in zip(keys, raws, strict=True)]

    def check(self, keys: Sequence[str]) -> bool:
        keys = list(keys)
        if not self._inner.check(keys):
            return False
        raws = self._inner.multi_get(keys)
        return all(self._opened(k, raw) is not None for k, raw in zip(keys, raws, strict=True))

    def wait(self, keys: Sequence[str], timeout: timedelta | None = None) -> None:
        keys = list(keys)
        if timeout is None:
            self._inner.wait(keys)
        else:
            self._inner.wait(keys, timeout)
        limit = timeout.total_seconds() if timeout is not None else self._timeout_s
        for key in keys:
            self._valid(key, limit)

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        """`desired` where the key holds `expected` (empty: where it is absent); signatures are
        deterministic, so the comparison is the store's own."""
        was = self._sealed(key, expected) if expected else b""
        now = self._inner.compare_set(key, cast(str, was), cast(str, self._sealed(key, desired)))
        return self._opened(key, now) or b""

    def add(self, key: str, value: int) -> int:
        return int(self._inner.add(key, value))

    def delete_key(self, key: str) -> bool:
        return bool(self._inner.delete_key(key))

    def num_keys(self) -> int:
        return int(self._inner.num_keys())
