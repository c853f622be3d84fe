"""A Debug Adapter Protocol client: the kernel's connection to one rank's debugpy.

debugpy on a rank (`debugpy.listen`) runs an adapter process that speaks DAP over TCP: messages
framed by a `Content-Length` header, requests answered by responses with the same `seq`, and
events at any time. `DapClient` sends requests from any thread and waits for their responses;
a reader thread hands events to `on_event` as they come (a rank that stops at a breakpoint
sends `stopped` while the kernel waits for its cell).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["DapClient", "DapError"]

Message = dict[str, Any]


class DapError(RuntimeError):
    """The adapter refused a request, went away, or did not answer in time."""


class DapClient:
    """One connection to a debug adapter: `sock`, connected to it (or to a relay to it)."""

    def __init__(
        self, sock: socket.socket, on_event: Callable[[Message], None], name: str = ""
    ) -> None:
        self.name = name or "debug adapter"
        self._sock = sock
        self._sock.settimeout(None)
        self._on_event = on_event
        self._seq = itertools.count(1)
        self._send_lock = threading.Lock()
        self._pending: dict[int, list[Any]] = {}  # seq -> [event, response]
        self._closed = False
        self._reader = threading.Thread(target=self._read, name=f"distnb-dap-{name}", daemon=True)
        self._reader.start()

    def request(self, command: str, arguments: Message | None = None, timeout: float = 30) -> Any:
        """Send `command` and wait for its response; its body, or DapError."""
        seq = next(self._seq)
        done = threading.Event()
        self._pending[seq] = [done, None]
        message: Message = {"seq": seq, "type": "request", "command": command}
        if arguments is not None:
            message["arguments"] = arguments
        self._send(message)
        if not done.wait(timeout):
            self._pending.pop(seq, None)
            raise DapError(f"{self.name}: no answer to {command!r} within {timeout:.0f} s")
        response = self._pending.pop(seq)[1]
        if response is None:
            raise DapError(f"{self.name}: the debug adapter went away during {command!r}")
        if not response.get("success", False):
            raise DapError(f"{self.name}: {command} failed: {response.get('message', '')}")
        return response.get("body", {})

    def send_request(self, command: str, arguments: Message | None = None) -> None:
        """Send `command` without waiting; its response is dropped."""
        message: Message = {"seq": next(self._seq), "type": "request", "command": command}
        if arguments is not None:
            message["arguments"] = arguments
        self._send(message)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    def _send(self, message: Message) -> None:
        body = json.dumps(message).encode()
        with self._send_lock:
            try:
                self._sock.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)
            except OSError as exc:
                raise DapError(f"{self.name}: the debug adapter went away ({exc})") from None

    def _read(self) -> None:
        buffer = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffer:
                    buffer += self._recv()
                header, buffer = buffer.split(b"\r\n\r\n", 1)
                length = next(
                    int(line.split(b":")[1])
                    for line in header.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                while len(buffer) < length:
                    buffer += self._recv()
                body, buffer = buffer[:length], buffer[length:]
                self._dispatch(json.loads(body))
        except (OSError, EOFError, StopIteration, ValueError):
            pass
        finally:
            self.close()  # the adapter ended the connection, or `close` did
            for waiting in list(self._pending.values()):
                waiting[0].set()  # no response: the request raises DapError
            self._on_event({"type": "event", "event": "distnb.closed", "body": {}})

    def _recv(self) -> bytes:
        data = self._sock.recv(65536)
        if not data:
            raise EOFError
        return data

    def _dispatch(self, message: Message) -> None:
        if message.get("type") == "response":
            waiting = self._pending.get(message.get("request_seq", -1))
            if waiting is not None:
                waiting[1] = message
                waiting[0].set()
        elif message.get("type") == "event":
            self._on_event(message)
