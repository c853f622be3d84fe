"""A client of torch's `TCPStore` that needs no torch: how the notebook's kernel reaches an
attached job's control plane (the launcher hosts a torch `TCPStore`; its ranks use torch's own
client). Importing torch costs a kernel over a second; this module costs a socket.

`WireStore(host, port, prefix)` speaks the store's wire protocol as torch's client does (torch's
`TCPStore.cpp` and its two servers, `TCPStoreBackend.cpp` and the default
`TCPStoreLibUvBackend.cpp`): after connecting it sends a validation query (a magic number) and a
ping; then each query is one byte of its type followed by its arguments: strings and values as
a 64-bit length then the bytes, counts and integers as native 64-bit words. Keys are prefixed as
`PrefixStore(prefix, TCPStore(...))` prefixes them, so both clients see the same keys.

It has the operations distnb's kernel uses, with torch's meanings: `get` and `multi_get` wait
for their keys up to the store's timeout, `wait` up to its own; a wait that runs out is
cancelled on the server and raises `StoreTimeout` (torch: `DistStoreError`); a server that
goes away, or never answers, raises `StoreGone` (torch: `DistNetworkError`). Both are
`RuntimeError`s, as torch's are. One query at a time per client (a lock): a thread that waits
long needs a client of its own, as with torch's. A query cut half-way (Ctrl-C) costs its
connection, and the next query makes a new one.

Beyond torch's client: `add_each`, `set_each`, `present_each` and `delete_each` send one query
per key in one write and then read the answers, which both servers give in order. The notebook
asks every rank of an attached job at once, and so pays one round trip for all of them where
one query after the other pays one per rank.
"""

from __future__ import annotations

import contextlib
import enum
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import timedelta

__all__ = ["StoreError", "StoreGone", "StoreTimeout", "WireStore"]

MAGIC = 0x3C85F7CE  # `validationMagicNumber`: the first query of every client
_WORD = struct.Struct("=Q")  # lengths and counts: native order, as torch sends them
_INT = struct.Struct("=q")
_U32 = struct.Struct("=I")  # the magic number and the ping's nonce
_CONNECT_PAUSE_S = (0.01, 0.5)  # between tries while the server refuses: first, at most


class Query(enum.IntEnum):
    """The query types of torch's store (`QueryType`); only the ones used here."""

    VALIDATE = 0
    SET = 1
    COMPARE_SET = 2
    GET = 3
    ADD = 4
    CHECK = 5
    WAIT = 6
    GETNUMKEYS = 7
    DELETE_KEY = 8
    MULTI_GET = 10
    CANCEL_WAIT = 12
    PING = 13


_READY = 0  # `CheckResponseType::READY`
_STOP_WAITING, _WAIT_CANCELED = 0, 1  # `WaitResponseType`


class StoreError(RuntimeError):
    """The store could not do what was asked (see the module)."""


class StoreTimeout(StoreError):
    """A wait for keys ran past its timeout; the store is usable still."""


class StoreGone(StoreError):
    """The connection to the store is lost (or was never made): the server has ended, or
    does not answer; this client is closed."""


def _data(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _string(value: str | bytes) -> bytes:
    data = _data(value)
    return _WORD.pack(len(data)) + data


class WireStore:
    """A client of the `TCPStore` at `host:port`, its keys under `prefix` (see the module);
    `timeout_s` bounds the connection's making, each answer, and `get`'s wait."""

    def __init__(self, host: str, port: int, prefix: str = "", timeout_s: float = 300.0) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self._prefix = f"/{prefix}/" if prefix else "/"
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._cut = False  # an exchange was cut half-way: the next query opens a new connection
        self._open()

    def _open(self) -> None:
        self._sock = self._connect()
        nonce = time.monotonic_ns() & 0xFFFFFFFF
        self._send(bytes([Query.VALIDATE]) + _U32.pack(MAGIC))
        self._send(bytes([Query.PING]) + _U32.pack(nonce))
        if _U32.unpack(self._recv(_U32.size))[0] != nonce:
            self.close()
            raise StoreGone(f"{self._where()} is not a torch TCPStore (its ping answer differs)")

    def __repr__(self) -> str:
        return f"<WireStore {self._where()} {self._prefix!r}>"

    def _where(self) -> str:
        return f"the store at {self.host}:{self.port}"

    def _connect(self) -> socket.socket:
        """A connection, retried while the server refuses (it may be starting), as torch's is."""
        deadline = time.monotonic() + self.timeout_s
        pause = _CONNECT_PAUSE_S[0]
        while True:
            left = deadline - time.monotonic()
            try:
                sock = socket.create_connection((self.host, self.port), timeout=max(left, 0.01))
            except OSError as exc:
                if not isinstance(exc, ConnectionRefusedError) or left <= pause:
                    raise StoreGone(f"cannot connect to {self._where()}: {exc}") from None
                time.sleep(pause)
                pause = min(pause * 2, _CONNECT_PAUSE_S[1])
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(self.timeout_s)
            return sock

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def __del__(self) -> None:
        self.close()

    # --- the wire -----------------------------------------------------------------------------

    def _live(self) -> socket.socket:
        if self._sock is None:
            raise StoreGone(f"the connection to {self._where()} is closed")
        return self._sock

    def _lost(self, why: object) -> StoreGone:
        self.close()
        return StoreGone(f"{self._where()} went away ({why}): the job has ended?")

    def _send(self, data: bytes) -> None:
        try:
            self._live().sendall(data)
        except OSError as exc:
            raise self._lost(exc) from None

    def _recv(self, n: int) -> bytes:
        sock, out = self._live(), bytearray()
        while len(out) < n:
            try:
                chunk = sock.recv(n - len(out))
            except TimeoutError:
                raise self._lost(f"no answer in {self.timeout_s:g} s") from None
            except OSError as exc:
                raise self._lost(exc) from None
            if not chunk:
                raise self._lost("connection closed")
            out += chunk
        return bytes(out)

    def _recv_bytes(self) -> bytes:
        return self._recv(_WORD.unpack(self._recv(_WORD.size))[0])

    def _recv_int(self) -> int:
        return int(_INT.unpack(self._recv(_INT.size))[0])

    def _keys(self, names: Sequence[str]) -> bytes:
        return _WORD.pack(len(names)) + b"".join(_string(self._prefix + k) for k in names)

    def _wait(self, names: Sequence[str], timeout_s: float) -> None:
        """Wait for `names` on the server; past `timeout_s` cancel the wait there (its answer
        may cross the cancel: then both come), and raise `StoreTimeout`."""
        self._send(bytes([Query.WAIT]) + self._keys(names))
        ready, _, _ = select.select([self._live()], [], [], max(timeout_s, 0.0))
        if ready:
            self._expect(_STOP_WAITING)
            return
        self._send(bytes([Query.CANCEL_WAIT]))
        if self._recv(1)[0] == _STOP_WAITING:
            self._expect(_WAIT_CANCELED)
        shown = ", ".join(self._prefix + k for k in names)
        raise StoreTimeout(f"wait timeout after {timeout_s * 1e3:.0f}ms, keys: {shown}")

    def _expect(self, answer: int) -> None:
        got = self._recv(1)[0]
        if got != answer:
            raise self._lost(f"answer {got} where {answer} was due")

    @contextlib.contextmanager
    def _exchange(self) -> Iterator[None]:
        """One query and its answer, alone on the connection. An exchange cut half-way (Ctrl-C
        in the kernel, between a query and its answer) leaves the connection out of step: the
        next answer read there would be this one's. It is closed, and the next query opens a
        new one."""
        with self._lock:
            if self._cut:
                self._cut = False
                self._open()
            try:
                yield
            except StoreError:
                raise
            except BaseException:
                self.close()
                self._cut = True
                raise

    # --- the Store interface (torch's names and meanings) -------------------------------------

    def set(self, key: str, value: str | bytes) -> None:
        with self._exchange():
            self._send(bytes([Query.SET]) + _string(self._prefix + key) + _string(value))

    def get(self, key: str) -> bytes:
        with self._exchange():
            self._wait([key], self.timeout_s)
            self._send(bytes([Query.GET]) + _string(self._prefix + key))
            return self._recv_bytes()

    def multi_get(self, names: Sequence[str]) -> list[bytes]:
        with self._exchange():
            self._wait(names, self.timeout_s)
            self._send(bytes([Query.MULTI_GET]) + self._keys(names))
            return [self._recv_bytes() for _ in names]

    def wait(self, names: Sequence[str], timeout: timedelta | None = None) -> None:
        with self._exchange():
            self._wait(names, self.timeout_s if timeout is None else timeout.total_seconds())

    def check(self, names: Sequence[str]) -> bool:
        with self._exchange():
            self._send(bytes([Query.CHECK]) + self._keys(names))
            return self._recv(1)[0] == _READY

    def add(self, key: str, value: int) -> int:
        with self._exchange():
            self._send(bytes([Query.ADD]) + _string(self._prefix + key) + _INT.pack(value))
            return self._recv_int()

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        """`desired` where the key holds `expected` (empty: where it is absent); the value
        found after, as torch's server says it (`expected` itself where the key is absent)."""
        query = _string(self._prefix + key) + _string(expected) + _string(desired)
        with self._exchange():
            self._send(bytes([Query.COMPARE_SET]) + query)
            return self._recv_bytes()

    def delete_key(self, key: str) -> bool:
        with self._exchange():
            self._send(bytes([Query.DELETE_KEY]) + _string(self._prefix + key))
            return self._recv_int() == 1

    # --- one write for many queries -----------------------------------------------------------

    def add_each(self, names: Sequence[str], value: int) -> list[int]:
        """`add(name, value)` for each of `names`: the values after."""
        data = b"".join(
            bytes([Query.ADD]) + _string(self._prefix + k) + _INT.pack(value) for k in names
        )
        with self._exchange():
            self._send(data)
            return [self._recv_int() for _ in names]

    def set_each(self, items: Sequence[tuple[str, str | bytes]]) -> None:
        data = b"".join(
            bytes([Query.SET]) + _string(self._prefix + k) + _string(v) for k, v in items
        )
        with self._exchange():
            self._send(data)

    def present_each(self, names: Sequence[str]) -> list[bool]:
        """Whether each of `names` holds a value (`check([name])` for each)."""
        data = b"".join(bytes([Query.CHECK]) + self._keys([k]) for k in names)
        with self._exchange():
            self._send(data)
            return [self._recv(1)[0] == _READY for _ in names]

    def delete_each(self, names: Sequence[str]) -> None:
        data = b"".join(bytes([Query.DELETE_KEY]) + _string(self._prefix + k) for k in names)
        with self._exchange():
            self._send(data)
            for _ in names:
                self._recv_int()

    def num_keys(self) -> int:
        """Every key of the store, under any prefix (as `PrefixStore.num_keys` counts)."""
        with self._exchange():
            self._send(bytes([Query.GETNUMKEYS]))
            return self._recv_int()
