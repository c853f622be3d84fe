"""The control plane's values, signed: what the kernel and the ranks post carries a tag that only
holders of the session's secret can make, and nothing read without a valid tag is used.

torch's TCPStore has no authentication: anyone who reaches its port can list, read, write and
delete keys. On loopback that is this machine's users only; once the control plane listens on a
network (ranks on other hosts), distnb signs it. Each value is stored as a 16-byte tag (HMAC-
SHA256 of the key and the value, truncated) followed by the value. The secret is made by the
kernel per session and reaches the ranks in their `RankSpec`, through ipyparallel's own signed
messages, never through the store.

A value whose tag does not verify was written by something that does not hold the secret: a
**forged** value. Nothing is decoded from it, and none is waited on in silence
(`distnb.contract.keys` says what each key's reader does about one):

- `get` and `wait` raise `ForgedValueError` at once, naming the key's role, but for keys the
  kernel posts again while they may be read (`keys.kept_by_kernel`): there they wait for the
  kernel's copy, up to their timeout;
- `check` says False and `multi_get` gives `b""` for it, as for a key not posted yet (boards read
  that as "not posted", beacon readers skip it), and the store notes the key: `take_forged`
  gives the keys seen forged since it was last asked, to callers that ask the writer to post
  again (`distnb.contract.posts`).

So a stranger who overwrites keys can delay the session while it keeps writing, and makes a
cell fail only where a value was written once by code distnb does not own, but cannot make a
rank or the kernel decode, believe or run anything it wrote. Counters (`add`) are plain
integers, read by the kernel only as counts of keys it then verifies.

The process group's own rendezvous goes through the same store (gloo's and NCCL's addresses),
so it is signed too. Libraries that rendezvous through `MASTER_ADDR`/`MASTER_PORT` themselves
(torch's `env://`) talk to the raw store, as they would under torchrun.

`Signed` signs any store with torch's `Store` interface, and needs no torch itself: on the ranks
and in a session's kernel it wraps torch's store (`distnb.contract.signed.SignedStore`, a torch
`Store` that process groups can use), in a kernel attached to a job the torch-free client
(`distnb.contract.storewire`), so that attaching does not import torch.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from distnb.contract import keys

__all__ = ["TAG_BYTES", "ForgedValueError", "Signed", "forged_message", "take_forged"]

TAG_BYTES = 16
_POLL_S = (0.001, 0.05)  # between reads of a forged key the kernel posts again: first, at most
_ADVICE = (
    "nothing was read from it. distnb posts such values again where it can; if this comes back, "
    "something on the network writes to the control plane's port: start the session on an "
    "address only the cluster reaches (--host)"
)


def forged_message(key: str) -> str:
    """Why a value under `key` was not used (the start of every message about a forgery)."""
    return (
        f"the control plane's value for {keys.role(key)} ({key!r}) was overwritten by something "
        "that does not hold the session's secret (a stranger on the network?)"
    )


class ForgedValueError(RuntimeError):
    """A key holds a value the session did not sign (see the module); `key` names it."""

    def __init__(self, key: str, waited_s: float = 0.0) -> None:
        self.key, self.waited_s = key, waited_s
        waited = f", and no valid copy came within {waited_s:g} s" if waited_s else ""
        super().__init__(f"{forged_message(key)}{waited}: {_ADVICE}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.waited_s))


class Signed:
    """`inner`, a store with torch's `Store` interface, with every value signed with `secret`
    (see the module)."""

    forged_error: type[ForgedValueError] = ForgedValueError  # what `get` and `wait` raise

    def __init__(self, inner: Any, secret: bytes, timeout_s: float = 30.0) -> None:
        self._inner, self._secret, self._timeout_s = inner, secret, timeout_s
        self.forged: set[str] = set()  # keys seen forged since `take_forged`

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
        """The key's value, which is there: at once, or `ForgedValueError` (see the module)."""
        value = self._opened(key, self._inner.get(key))
        if value is not None:
            return value
        self.forged.add(key)
        if not keys.kept_by_kernel(key):
            raise self.forged_error(key)
        deadline = time.monotonic() + timeout_s
        pause = _POLL_S[0]
        while time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(pause * 2, _POLL_S[1])
            value = self._opened(key, self._inner.get(key))
            if value is not None:
                return value
        raise self.forged_error(key, timeout_s)

    def state(self, key: str) -> str:
        """ "valid", "forged" or "absent": for readers that treat each alike (off the hot path)."""
        if not self._inner.check([key]):
            return "absent"
        return "valid" if self._checked(key, self._inner.get(key)) is not None else "forged"

    def restore(self, key: str, value: str | bytes) -> bool:
        """Post `value` under `key` only where the key holds a forged value or none, in one
        step on the server (`compare_set`), so that a valid value posted meanwhile (the
        writer's newer one) is never replaced by this older copy. Whether it was posted."""
        raw = self._inner.get(key) if self._inner.check([key]) else b""
        if raw and self._opened(key, raw) is not None:
            return False
        sealed = self._sealed(key, value)
        return bytes(self._inner.compare_set(key, raw, sealed)) == sealed

    def close(self) -> None:
        """Close `inner`'s connection, where it has one to close (torch's close theirs when
        collected)."""
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()

    def take_forged(self) -> list[str]:
        """The keys seen holding a forged value since the last call."""
        found = sorted(self.forged)
        self.forged.clear()
        return found

    # --- the Store interface ---------------------------------------------------------------

    def set(self, key: str, value: str | bytes) -> None:
        self._inner.set(key, self._sealed(key, value))

    def get(self, key: str) -> bytes:
        return self._valid(key, self._timeout_s)

    def multi_get(self, names: Sequence[str]) -> list[bytes]:
        raws = self._inner.multi_get(list(names))
        return [self._checked(k, raw) or b"" for k, raw in zip(names, raws, strict=True)]

    def _checked(self, key: str, raw: bytes) -> bytes | None:
        value = self._opened(key, raw)
        if value is None:
            self.forged.add(key)
        return value

    def present(self, names: Sequence[str]) -> bool:
        """Whether every key of `names` holds a value, signed or not (one round trip, where
        `check` also reads and verifies them; `multi_get` then reads and verifies them)."""
        return bool(self._inner.check(list(names)))

    def check(self, names: Sequence[str]) -> bool:
        names = list(names)
        if not self._inner.check(names):
            return False
        raws = self._inner.multi_get(names)
        opened = [self._checked(k, raw) for k, raw in zip(names, raws, strict=True)]
        return all(value is not None for value in opened)

    def wait(self, names: Sequence[str], timeout: timedelta | None = None) -> None:
        names = list(names)
        if timeout is None:
            self._inner.wait(names)
        else:
            self._inner.wait(names, timeout)
        # A forged value waits for the kernel's copy no longer than the store's own timeout,
        # however long the wait for the key itself may be (a thread's wait for ever).
        limit = min(timeout.total_seconds(), self._timeout_s) if timeout else self._timeout_s
        for key in names:
            self._valid(key, limit)

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        """`desired` where the key holds `expected` (empty: where it is absent); signatures are
        deterministic, so the comparison is the store's own."""
        was = self._sealed(key, expected) if expected else b""
        now = self._inner.compare_set(key, was, self._sealed(key, desired))
        return self._checked(key, now) or b""

    def add(self, key: str, value: int) -> int:
        return int(self._inner.add(key, value))

    def delete_key(self, key: str) -> bool:
        return bool(self._inner.delete_key(key))

    # one write for many queries where the inner store has them (`WireStore`), else in turn

    def add_each(self, names: Sequence[str], value: int) -> list[int]:
        batch = getattr(self._inner, "add_each", None)
        if batch is not None:
            return list(batch(names, value))
        return [self.add(k, value) for k in names]

    def set_each(self, items: Sequence[tuple[str, str | bytes]]) -> None:
        sealed = [(k, self._sealed(k, v)) for k, v in items]
        batch = getattr(self._inner, "set_each", None)
        if batch is not None:
            batch(sealed)
            return
        for k, v in sealed:
            self._inner.set(k, v)

    def present_each(self, names: Sequence[str]) -> list[bool]:
        batch = getattr(self._inner, "present_each", None)
        if batch is not None:
            return list(batch(names))
        return [self.present([k]) for k in names]

    def delete_each(self, names: Sequence[str]) -> None:
        batch = getattr(self._inner, "delete_each", None)
        if batch is not None:
            batch(names)
            return
        for k in names:
            self._inner.delete_key(k)

    def num_keys(self) -> int:
        return int(self._inner.num_keys())


def take_forged(store: Any) -> list[str]:
    """The keys `store` saw forged since the last call ([] for a store that is not signed)."""
    return store.take_forged() if isinstance(store, Signed) else []
