"""The kernel's link to a rank's debug adapter on this machine, with real sockets."""

from __future__ import annotations

import socket
import threading
import time

from distnb.session.debugger.links import _connect


def test_an_adapter_that_refuses_for_a_moment_is_asked_again() -> None:
    with socket.socket() as probe:  # a port nobody listens on yet
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listening = threading.Event()

    def listen_later() -> None:
        time.sleep(0.5)  # refused until then
        server.bind(("127.0.0.1", port))
        server.listen()
        listening.set()

    thread = threading.Thread(target=listen_later)
    thread.start()
    try:
        with _connect("127.0.0.1", port) as link:
            assert listening.is_set()
            peer, _ = server.accept()
            link.sendall(b"hello")
            assert peer.recv(5) == b"hello"
            peer.close()
    finally:
        thread.join()
        server.close()
