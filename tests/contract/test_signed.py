"""The signed control plane against a stranger, in one process: a real TCPStore, a stranger's
raw client, the session's signed clients, and the re-post thread (`distnb.contract.posts`)."""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Iterator

import pytest
import torch.distributed as dist

from distnb.contract import keys, posts
from distnb.contract.signed import ForgedValueError, SignedStore, take_forged
from distnb.rank.checked.exchange import StoreBoard, collect
from harness.processes import NAMED_S

SECRET = b"s" * 32
PREFIX = "distnb-test"
BOUND_S = 10.0  # "named rather than hanging": a re-post comes within about a second


@pytest.fixture
def server() -> Iterator[dist.TCPStore]:
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(30)
    )
    yield store
    posts._kept.clear()
    posts._asked.clear()


def client(server: dist.TCPStore, timeout_s: float = 30.0) -> SignedStore:
    # connected under a bound that names a hang (a loaded machine takes over a second to
    # connect), then given the timeout the test is about
    raw = dist.TCPStore(
        "127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=NAMED_S)
    )
    raw.set_timeout(datetime.timedelta(seconds=timeout_s))
    return SignedStore(dist.PrefixStore(PREFIX, raw), SECRET, timeout_s)


def forge(server: dist.TCPStore, key: str) -> None:
    """What a stranger does: random bytes under a key of the session. A store's `set` has no
    reply, and writes on two connections reach the server in either order: a read on the same
    connection after it (`landed`) orders it before what the test writes next."""
    server.set(f"{PREFIX}/{key}", b"\x00not signed by the session\xff")
    landed(server, f"{PREFIX}/{key}")


def landed(store: dist.Store, key: str) -> None:
    """Once this returns, the server has applied every write `store` sent before."""
    store.check([key])


def test_a_forged_value_written_once_is_named_at_once(server: dist.TCPStore) -> None:
    store = client(server)
    store.set(keys.host(1), "h2|boot|42")
    forge(server, keys.host(1))
    started = time.monotonic()
    with pytest.raises(
        ForgedValueError, match=r"rank 1's host identity \('check/host/1'\) was ove"
    ):
        store.get(keys.host(1))
    assert time.monotonic() - started < 10  # at once, not the store's 30 s timeout
    assert not store.check([keys.host(1)]) and store.multi_get([keys.host(1)]) == [b""]
    assert take_forged(store) == [keys.host(1)] and take_forged(store) == []


def test_a_forged_kernel_post_is_waited_through_until_the_kernel_posts_it_again(
    server: dist.TCPStore,
) -> None:
    kernel, rank = client(server), client(server)
    kernel.set(keys.RUN, keys.encode_run(7, 3, True))
    forge(server, keys.RUN)
    later = threading.Timer(0.3, lambda: kernel.set(keys.RUN, keys.encode_run(7, 3, True)))
    later.start()
    assert keys.decode_run(rank.get(keys.RUN))[:2] == (7, 3)
    later.join()
    forge(server, keys.RUN)  # and never posted again: named after the store's timeout
    with pytest.raises(ForgedValueError, match=r"no valid copy came within 0\.5 s"):
        client(server, timeout_s=0.5).get(keys.RUN)


def test_a_forged_slot_is_posted_again_by_its_writer_while_the_reader_waits(
    server: dist.TCPStore, capfd: pytest.CaptureFixture[str]
) -> None:
    """Rank 1 posts its fingerprint and goes on (into the collective): a stranger overwrites
    the slot; rank 0, still waiting, asks, and rank 1's re-post thread posts it again."""
    writer, reader = client(server), client(server)
    reposter = posts.Reposter(1, lambda: client(server))
    reposter.start()
    try:
        mine = StoreBoard(writer, keys.board("1", "c-0"), 2, owners=(0, 1))
        theirs = StoreBoard(reader, keys.board("1", "c-0"), 2, owners=(0, 1))
        mine.post(1, 1, b"F-rank-1")
        forge(server, mine.key(1, 1))
        started = time.monotonic()
        assert collect(theirs, [1], 1, lambda *_: None) == [b"F-rank-1"]
        assert time.monotonic() - started < BOUND_S
    finally:
        reposter.stop(writer)
    said = capfd.readouterr().err
    assert "the fingerprint that member 1 of process group 0 posted" in said
    assert "rank 1 was asked to post it again" in said


def test_a_slot_deleted_after_it_was_seen_is_asked_for_again(
    server: dist.TCPStore, capfd: pytest.CaptureFixture[str]
) -> None:
    """A missing key makes the store's `multi_get` wait out its timeout (1 s here, 30 s on
    ranks); the reader then asks the writer, as for a forged slot."""
    writer, reader = client(server), client(server, timeout_s=1.0)
    reposter = posts.Reposter(1, lambda: client(server))
    reposter.start()
    try:
        mine = StoreBoard(writer, keys.board("2", "c-0"), 2, owners=(0, 1))
        theirs = StoreBoard(reader, keys.board("2", "c-0"), 2, owners=(0, 1))
        mine.post(1, 1, b"F-one")
        assert theirs.read(1, 1) == b"F-one"  # the slot's key is known to exist from now on
        mine.post(1, 3, b"F-three")
        server.delete_key(f"{PREFIX}/{mine.key(1, 3)}")
        assert collect(theirs, [1], 3, lambda *_: None) == [b"F-three"]
    finally:
        reposter.stop(writer)
    assert "is gone (deleted by something that reached the store?)" in capfd.readouterr().err


def test_a_stranger_s_request_to_post_again_is_not_obeyed(server: dist.TCPStore) -> None:
    writer = client(server)
    reposter = posts.Reposter(0, lambda: client(server))
    reposter.start()
    try:
        posts.post(writer, keys.host(0), "mine")
        forge(server, keys.repost(0))  # not signed: passed over
        time.sleep(0.2)
        assert reposter._thread.is_alive()
        forge(server, keys.host(0))
        posts.ask_again(writer, [keys.host(0)], "rank 1")
        deadline = time.monotonic() + BOUND_S
        while not writer.check([keys.host(0)]) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert writer.get(keys.host(0)) == b"mine"
    finally:
        reposter.stop(writer)
    assert not reposter._thread.is_alive()


def test_a_request_served_late_never_puts_an_older_copy_over_a_newer_value(
    server: dist.TCPStore,
) -> None:
    """The writer went on (a newer stamp in the same slot) after a reader asked for the slot it
    had found forged: the re-post must leave the newer value, or the reader of the newer stamp
    would find a valid older one and wait for ever without asking again."""
    writer, reader = client(server), client(server)
    board = StoreBoard(writer, keys.board("3", "c-0"), 2, owners=(0, 1))
    board.post(1, 1, b"F-one")  # kept
    forge(server, board.key(1, 1))
    newer = b"\x03" + bytes(7) + b"F-three"  # stamp 3, same slot, landed before it was kept
    writer.set(board.key(1, 3), newer)
    landed(writer, board.key(1, 3))  # the newer value is there before anyone asks
    reposter = posts.Reposter(1, lambda: client(server))
    reposter.start()
    try:
        posts.ask_again(reader, [board.key(1, 1)], "rank 0")  # the late request
        deadline = time.monotonic() + BOUND_S
        while server.check([f"{PREFIX}/{keys.repost(1)}"]) and time.monotonic() < deadline:
            time.sleep(0.01)  # taken: the re-post thread is serving it
        posts.post(writer, keys.host(1), "mine")
        forge(server, keys.host(1))
        posts.ask_again(reader, [keys.host(1)], "rank 0")  # served after the one before it
        deadline = time.monotonic() + BOUND_S
        while not reader.check([keys.host(1)]) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert reader.get(keys.host(1)) == b"mine"
        assert reader.get(board.key(1, 3)) == newer
        assert StoreBoard(reader, keys.board("3", "c-0"), 2).read(1, 3) == b"F-three"
    finally:
        reposter.stop(writer)
