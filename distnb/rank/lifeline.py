"""A rank's lifeline to its kernel: a thread that ends the rank's engine once the kernel's
control plane is gone.

Processes on other hosts cannot be reaped from the kernel's machine: a rank whose kernel died,
or whose host was cut off (and then stopped without it), must end by itself. ipyparallel's own
watch (the engine's heartbeat check) runs on the engine's event loop, which a running cell
blocks: a rank in `time.sleep`, a training loop or a collective outlived its session by the
cell's length, and an endless loop for ever. So a thread of its own, started when the engine
becomes a rank, keeps one TCP connection open to the control plane's port, saying nothing on
it (a call to the store on a cut link blocks for minutes, measured here), with TCP keepalive
probes every second. The connection ends when the kernel's process does (its socket closed) or
when `SILENCE_S` of probes went unanswered (a cut link); the thread then connects again, every
`PROBE_S`. When no connection has held for `SILENCE_S`, or the port refuses twice in a row (the
kernel's process, which holds the store, is gone, or its session stopped), it ends the rank: a
line in the engine's log, then SIGKILL to every process below the engine (its nanny, what the
cell started) and to the engine itself. One connection for the session's life, not one a
second: at 16 ranks a connect and close from every rank every second stalled the kernel's
store for seconds at a time (an empty cell took 5 s, against 0.05 s without the probes).
When the port refused, the kernel is gone for good, and the session's profile folder the engine
ran in goes too (`leftover`: on another host, the copy the ssh launcher made, which only the
kernel's stop would have removed); silence alone may be a network cut off from a kernel that
lives, whose folder that may be.

The kernel's store answers from a native thread, so a kernel busy in a long cell, or waiting for
the user at a debugger prompt, keeps its ranks alive. A rank on a host cut off ends within
`BOUND_S` of the cut (`SILENCE_S` of unanswered probes, plus a wait's period and a connect's
timeout); the
controller names it lost after 3 s of heartbeat silence, long before.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable

import psutil

__all__ = ["BOUND_S", "CONNECT_S", "PROBE_S", "SILENCE_S", "Lifeline", "end_engine"]

PROBE_S = 1.0
CONNECT_S = 2.0
SILENCE_S = 15.0
REFUSED = 2  # refusals in a row that mean the port is closed for good
BOUND_S = SILENCE_S + PROBE_S + CONNECT_S  # what the stop's warning and the guide promise


def end_engine(reason: str) -> None:
    """Say why in the engine's log (fd 2), then SIGKILL every process below this one and this
    one: the engine, its nanny (a child in a session of its own) and what its cells started."""
    with contextlib.suppress(OSError):
        os.write(
            2, f"distnb: {reason}: ending this engine, its nanny and their children\n".encode()
        )
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
    os.kill(os.getpid(), signal.SIGKILL)


class Lifeline:
    """Watches `address` (the control plane's host and port) from a thread of its own and
    calls `end(reason)` once it is gone (see the module)."""

    def __init__(
        self,
        rank: int,
        address: tuple[str, int],
        end: Callable[[str], None] = end_engine,
        silence_s: float = SILENCE_S,
        leftover: str = "",
    ) -> None:
        self.rank, self.address, self._end, self.silence_s = rank, address, end, silence_s
        self.leftover = leftover
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="distnb-lifeline", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=CONNECT_S + 1)

    def _watch(self) -> None:
        heard, refused = time.monotonic(), 0
        link: socket.socket | None = None
        while not self._stopped.is_set():
            if link is not None:
                if not select.select([link], [], [], PROBE_S)[0]:
                    heard = time.monotonic()  # still open: the kernel's machine answers probes
                    continue
                if not _ended_by_peer(link):  # the probes went unanswered: a lost link
                    heard = time.monotonic() - self.silence_s
                link.close()
                link = None
            else:
                try:
                    link = _connect(self.address)
                    heard, refused = time.monotonic(), 0
                    continue
                except ConnectionRefusedError:
                    refused += 1
                except OSError:  # unreachable, timed out: silence, which may end
                    refused = 0
            silent = time.monotonic() - heard
            if refused >= REFUSED or silent >= self.silence_s:
                break
            if link is None:
                self._stopped.wait(PROBE_S)
        else:
            if link is not None:
                link.close()
            return  # stopped: the rank shut down
        host, port = self.address
        why = f"has not answered for {silent:.0f} s"
        if refused >= REFUSED:
            why = "refuses connections"
            if self.leftover:
                shutil.rmtree(self.leftover, ignore_errors=True)
        self._end(f"rank {self.rank}: the kernel's control plane at {host}:{port} {why}")


def _connect(address: tuple[str, int]) -> socket.socket:
    """A connection to the store's port that ends by itself once `SILENCE_S` of keepalive
    probes, one a second after a second of quiet, went unanswered."""
    link = socket.create_connection(address, timeout=CONNECT_S)
    link.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    with contextlib.suppress(AttributeError, OSError):  # Linux's names; elsewhere the defaults
        link.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 1)
        link.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
        link.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, int(SILENCE_S) - 1)
    return link


def _ended_by_peer(link: socket.socket) -> bool:
    """A readable connection on which the store never speaks first: closed by the kernel's side
    (True), or dropped after unanswered probes (False)."""
    try:
        link.recv(1)
    except (TimeoutError, OSError) as exc:
        return isinstance(exc, ConnectionResetError)
    return True
