"""Boards of stamped slots, in one process: post/read/lap/retract, the store board, waits."""

from __future__ import annotations

import datetime
import os
import platform
import sys
import threading
import time
from collections.abc import Iterator, Sequence

import pytest
import torch.distributed as dist

from distnb.rank.checked import exchange, futex
from distnb.rank.checked.exchange import LAPPED, ShmBoard, StoreBoard, collect
from harness.processes import NAMED_S


@pytest.fixture
def shm() -> Iterator[ShmBoard]:
    path = exchange.shm_path(f"test{os.getpid()}", "board")
    board = ShmBoard(path, rings=2, depth=2, slot_size=256)
    yield board
    board.close(unlink=True)


@pytest.fixture
def store() -> dist.Store:
    return dist.HashStore()


def test_post_then_read(shm: ShmBoard) -> None:
    assert shm.read(1, 1) is None  # nothing posted yet
    shm.post(1, 1, b"F-one")
    assert shm.read(1, 1) == b"F-one"
    shm.post(1, 2, b"F-two")  # the other slot: seq 1 is still readable
    assert shm.read(1, 1) == b"F-one"
    shm.post(1, 3, b"F-three")  # overwrites seq 1's slot
    assert shm.read(1, 1) is LAPPED
    assert shm.read(1, 5) is None  # not posted yet
    shm.retract(1, 3)
    assert shm.read(1, 3) is None


def test_a_second_mapping_sees_the_posts(shm: ShmBoard) -> None:
    other = ShmBoard(shm.path, rings=2, depth=2, slot_size=256)
    try:
        shm.post(0, 7, b"F" * 200)
        assert other.read(0, 7) == b"F" * 200
    finally:
        other.close(unlink=False)


def test_torn_payload_reads_as_not_yet(shm: ShmBoard) -> None:
    shm.post(0, 1, b"F-payload")
    off = shm._slot(0, 1) + 24
    shm.mm[off : off + 1] = b"X"  # as if the copy caught a half-written payload
    assert shm.read(0, 1) is None


def test_oversized_payload_spills_to_the_store(store: dist.Store) -> None:
    path = exchange.shm_path(f"test{os.getpid()}", "small")
    spill = StoreBoard(store, "big", 2)
    board = ShmBoard(path, rings=1, depth=2, slot_size=64, overflow=spill)
    try:
        board.post(0, 1, b"F" + b"x" * 500)
        assert board.read(0, 1) == b"F" + b"x" * 500
    finally:
        board.close(unlink=True)


def test_store_board(store: dist.Store) -> None:
    board = StoreBoard(store, "fp/g", 2)
    assert board.read_many([0, 1], 1) == [None, None]  # missing keys never block
    board.post(0, 1, b"F-a")
    board.post(1, 1, b"F-b")
    assert board.read_many([0, 1], 1) == [b"F-a", b"F-b"]
    board.post(0, 3, b"F-c")
    assert board.read(0, 1) is LAPPED
    board.retract(0, 3)
    assert board.read(0, 3) is None


def _post_later(board: exchange.Board, ring: int, stamp: int, delay: float) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        board.post(ring, stamp, b"F-late")

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.parametrize("kind", ["shm", "store"])
def test_collect_waits_for_a_late_post(shm: ShmBoard, store: dist.Store, kind: str) -> None:
    board: exchange.Board = shm if kind == "shm" else StoreBoard(store, "fp/w", 2)
    ticks: list[Sequence[int]] = []
    thread = _post_later(board, 1, 1, 0.03)
    t0 = time.monotonic()
    assert collect(board, [1], 1, lambda _, missing: ticks.append(list(missing))) == [b"F-late"]
    thread.join()
    assert time.monotonic() - t0 < NAMED_S  # returned once the post came: it did not wait on
    assert ticks and ticks[0] == [1]  # a 30 ms wait ticks (every 5 ms) with what is missing


def test_a_wait_of_thousands_of_polls_keeps_polling(store: dist.Store) -> None:
    """A peer seconds late on the store path (another host): the poll count grows past what
    `2**attempt` can scale as a float; each poll still sleeps at most MAX_SLEEP_S."""
    board = StoreBoard(store, "fp/late", 2)
    board.block(1, 1, 10**9, attempt=5_000)  # raised OverflowError before
    assert exchange.backoff_s(5_000, 10**9) == exchange.MAX_SLEEP_S
    thread = _post_later(board, 1, 1, 1.5)  # about 1,500 polls of 1 ms
    assert collect(board, [1], 1, lambda *_: None) == [b"F-late"]
    thread.join()


def test_a_board_polls_around_the_time_it_expects_the_next_post(
    shm: ShmBoard, store: dist.Store
) -> None:
    spin = exchange.SPIN_NS
    assert shm.window() == (0, spin)  # ranks in step: poll from the start

    def post_at_30_ms(elapsed: int, missing: Sequence[int]) -> None:
        if elapsed >= 30_000_000:  # a wait of at least 30 ms: far outside that window
            shm.post(1, 1, b"F-late")

    began = time.monotonic_ns()
    assert collect(shm, [1], 1, post_at_30_ms) == [b"F-late"]
    took = time.monotonic_ns() - began  # the wait, and a little more (any load)
    start, end = shm.window()  # a miss: half as wide, around the wait just seen
    seen = (start + end) // 2
    assert end - start == spin and 30_000_000 <= seen <= took
    shm.waited(shm.expect_ns + spin // 10)  # as foreseen: full width again
    assert shm.window()[1] - shm.window()[0] == 2 * spin
    for i in range(40):  # peers that come at unforeseeable times: soon no polling at all
        shm.waited(10 * spin * (i % 2 + 1))
    assert shm.window() == (0, 0)  # and no wake-up for an empty window
    assert StoreBoard(store, "fp/s", 2).window() == (0, 0)  # each poll is a round trip


def test_tick_can_stop_a_wait(shm: ShmBoard) -> None:
    class Stop(Exception):
        pass

    def tick(elapsed: int, missing: Sequence[int]) -> None:
        raise Stop

    with pytest.raises(Stop):
        collect(shm, [0], 1, tick)


@pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() not in ("x86_64", "aarch64"),
    reason="futexes through ctypes: Linux x86-64/aarch64 only (elsewhere boards poll)",
)
def test_futex_is_used_here() -> None:
    assert futex.AVAILABLE


def test_cleanup_removes_a_sessions_files() -> None:
    session = f"clean{os.getpid()}"
    for name in ("a", "b"):
        ShmBoard(exchange.shm_path(session, name), 1, 2, 64).close(unlink=False)
    assert exchange.cleanup(session) == 2
    assert exchange.cleanup(session) == 0


def test_store_timeout_not_hit() -> None:
    # `StoreBoard` must never call a blocking get on a missing key; a short-timeout store
    # would raise if it did.
    short = dist.HashStore()
    short.set_timeout(datetime.timedelta(milliseconds=50))
    board = StoreBoard(short, "fp/t", 2)
    assert board.read(0, 1) is None
