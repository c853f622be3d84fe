"""A debug adapter's connection carried over the control plane, for ranks on other hosts.

debugpy's adapter on a rank listens on loopback only: it has no authentication, so it must not
listen on a network. The kernel reaches a rank of its own machine there directly; a rank on
another host it reaches through the control plane, which is signed off loopback
(`distnb.contract.signed`). On each side a `Relay` pumps a socket's bytes into numbered keys of the
store (`keys.dap`), and the other side's keys into the socket: on the rank the socket is a
connection to its adapter, in the kernel one end of a socket pair whose other end is the
`DapClient`'s. Either side closing its socket ends the other's, through a last key that says so.
Each key is read once and deleted.

Each direction has a store client of its own: a client waiting for the next key holds its
connection, which would delay the other direction's writes. No torch here: the kernel uses it.

A forged piece where the receiver reads next (`distnb.contract.signed`) is waited through for
`GRACE_S`: a stranger who wrote it before the sender did is overwritten by the genuine piece.
One still forged then was written over the genuine piece: those bytes are gone, and the debug
protocol cannot skip them, so the connection ends, saying so on stderr; the kernel connects
again at the next cell (`distnb.session.debugger.visual`).
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from datetime import timedelta
from typing import Any

from distnb.contract import keys

__all__ = ["Relay"]

_CHUNK = 1 << 16
_FOREVER = timedelta(days=365)  # a store's wait without a timeout (it takes none)
_DATA, _END = b"d", b"e"
GRACE_S = 10.0  # for the genuine piece to replace a forged one


class Relay:
    """Pumps `sock` to `channel`'s keys towards `to` ("kernel" or "rank"), and the keys from
    the other side into `sock`, through the two store clients `stores` (see the module)."""

    def __init__(self, sock: socket.socket, channel: str, to: str, stores: tuple[Any, Any]):
        self.sock, self.channel, self.to = sock, channel, to
        self.back = "rank" if to == "kernel" else "kernel"
        self.ended = threading.Event()
        self._out, self._in = stores
        self._next_in = 0  # the key the receiver waits for
        for target in (self._send, self._receive):
            name = f"distnb-dap-{channel}{target.__name__}"
            threading.Thread(target=target, name=name, daemon=True).start()

    def _send(self) -> None:
        n = 0
        try:
            while data := self.sock.recv(_CHUNK):
                self._out.set(keys.dap(self.channel, self.to, n), _DATA + data)
                n += 1
        except (OSError, RuntimeError):
            pass  # the socket or the store went away: end both directions
        finally:
            with contextlib.suppress(Exception):
                self._out.set(keys.dap(self.channel, self.to, n), _END)
            self.close()
            self.sock.close()

    def _receive(self) -> None:
        try:
            while not self.ended.is_set():
                key = keys.dap(self.channel, self.back, self._next_in)
                value = self._next_piece(key)
                self._in.delete_key(key)
                self._next_in += 1
                if not value.startswith(_DATA):
                    break
                self.sock.sendall(value[len(_DATA) :])
        except (OSError, RuntimeError) as exc:  # the socket or the store went away, or a forgery
            if getattr(exc, "key", None) is not None:  # signed.ForgedValueError (no torch here)
                rank = self.channel.split("-")[0]
                print(
                    f"distnb: the visual debugger's connection to rank {rank} ended: {exc}; "
                    "the next cell connects again",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            self.close()

    def _next_piece(self, key: str) -> bytes:
        """The piece under `key`, once there and genuine (see the module)."""
        try:
            self._in.wait([key], _FOREVER)  # woken by the next piece, or by `close`
        except RuntimeError as exc:
            if getattr(exc, "key", None) is None:  # signed.ForgedValueError (no torch here)
                raise
            deadline = time.monotonic() + GRACE_S
            while time.monotonic() < deadline and not self.ended.is_set():
                time.sleep(0.05)
                if self._in.check([key]):
                    break
            else:
                raise
        value: bytes = self._in.get(key)
        return value

    def close(self) -> None:
        """End both directions: the other side is told by the sender's last key, and this
        side's receiver by an end where it waits (the key it waits for, or the next one)."""
        if self.ended.is_set():
            return
        self.ended.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # the sender's recv returns: it posts the end
        n = self._next_in
        with contextlib.suppress(Exception):
            for key in (
                keys.dap(self.channel, self.back, n),
                keys.dap(self.channel, self.back, n + 1),
            ):
                self._out.set(key, _END)
