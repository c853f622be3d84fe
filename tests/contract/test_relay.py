"""The debug adapter's relay over a real, signed TCPStore: bytes both ways in order, large
messages in pieces, each side's end reaching the other, and a stranger's keys never delivered."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch.distributed as dist

from distnb.contract import keys, relay
from distnb.contract.relay import Relay
from distnb.contract.signed import SignedStore
from harness.processes import NAMED_S

SECRET = os.urandom(32)


@pytest.fixture
def server() -> Iterator[dist.TCPStore]:
    yield dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def client(server: dist.TCPStore) -> SignedStore:
    raw = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=5))
    return SignedStore(dist.PrefixStore("s", raw), SECRET, timeout_s=5)


def adapter() -> tuple[socket.socket, socket.socket]:
    """(the rank's connection to its "adapter", the adapter's end)."""
    listener = socket.create_server(("127.0.0.1", 0))
    rank_end = socket.create_connection(listener.getsockname())
    adapter_end, _ = listener.accept()
    listener.close()
    return rank_end, adapter_end


def read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, f"closed after {len(data)} of {n} bytes"
        data += chunk
    return data


def relayed(server: dist.TCPStore) -> tuple[socket.socket, socket.socket, Relay, Relay]:
    """(the kernel's DapClient end, the adapter's end, the kernel's relay, the rank's)."""
    ours, theirs = socket.socketpair()
    kernel = Relay(theirs, "1-ab", "rank", (client(server), client(server)))
    rank_end, adapter_end = adapter()
    rank = Relay(rank_end, "1-ab", "kernel", (client(server), client(server)))
    return ours, adapter_end, kernel, rank


def test_bytes_cross_both_ways_in_order_and_in_pieces(server: dist.TCPStore) -> None:
    ours, adapter_end, _, _ = relayed(server)
    big = os.urandom(300_000)  # several of the relay's 64 KiB pieces
    sender = threading.Thread(target=ours.sendall, args=(b"Content-Length: 2\r\n\r\n{}" + big,))
    sender.start()
    assert read(adapter_end, 23 + len(big)) == b"Content-Length: 2\r\n\r\n{}" + big
    sender.join()
    adapter_end.sendall(b"answer")
    assert read(ours, 6) == b"answer"
    ours.close()


def test_either_end_closing_ends_the_other(server: dist.TCPStore) -> None:
    ours, adapter_end, kernel, rank = relayed(server)
    ours.close()  # the kernel's debugger disconnects: the rank's adapter sees its client go
    adapter_end.settimeout(NAMED_S)
    assert adapter_end.recv(10) == b""
    assert kernel.ended.wait(NAMED_S) and rank.ended.wait(NAMED_S)

    ours, adapter_end, kernel, _ = relayed(server)
    adapter_end.close()  # the rank's adapter goes (the rank died): the kernel's end is told
    ours.settimeout(NAMED_S)
    assert ours.recv(10) == b""
    assert kernel.ended.wait(NAMED_S)


def test_a_strangers_key_is_not_delivered(server: dist.TCPStore) -> None:
    ours, adapter_end, _, _ = relayed(server)
    stranger = dist.TCPStore("127.0.0.1", server.port, is_master=False)
    # a forged request where the rank's relay reads next: it waits for a signed one instead
    stranger.set("s/" + keys.dap("1-ab", "rank", 0), b"d" * 40 + b'{"command":"evaluate"}')
    adapter_end.settimeout(0.5)
    with pytest.raises(TimeoutError):
        adapter_end.recv(100)
    ours.sendall(b"genuine")  # the kernel's piece 0 replaces the forged one
    adapter_end.settimeout(NAMED_S)
    assert read(adapter_end, 7) == b"genuine"
    ours.close()


def test_a_piece_overwritten_after_it_was_sent_ends_the_connection_saying_so(
    server: dist.TCPStore, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The genuine piece is gone: the relay ends (the next cell connects again) instead of
    waiting for ever for a piece nobody will send again."""
    monkeypatch.setattr(relay, "GRACE_S", 0.5)
    ours, theirs = socket.socketpair()
    Relay(theirs, "1-ab", "rank", (client(server), client(server)))
    ours.sendall(b"genuine")  # piece 0 towards the rank, which does not read it yet
    key = "s/" + keys.dap("1-ab", "rank", 0)
    raw = dist.TCPStore("127.0.0.1", server.port, is_master=False)
    while not raw.check([key]):
        threading.Event().wait(0.01)
    raw.set(key, b"d" * 40 + b"forged")  # a stranger writes over it before the rank reads it
    rank_end, adapter_end = adapter()
    rank = Relay(rank_end, "1-ab", "kernel", (client(server), client(server)))
    assert rank.ended.wait(NAMED_S)
    adapter_end.settimeout(NAMED_S)
    assert adapter_end.recv(10) == b""  # nothing forged reached the adapter
    said = capfd.readouterr().err
    assert "the visual debugger's connection to rank 1 ended" in said
    assert "a piece of the visual debugger's connection" in said and "next cell" in said
    ours.close()
