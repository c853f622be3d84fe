"""The path between hosts, on one host: with DISTNB_SHM=0 every rank counts as a host of its own,
so fingerprints, waits and releases go through the control plane's store, as across machines.

Waits of minutes, a peer that finishes without coming, a peer that dies: the same outcomes as on
shared memory (tests/session/runs/test_checked_cells.py), through the store.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

import distnb
from distnb.errors import CollectiveDesyncError, CollectiveMismatchError, RankDiedError
from distnb.rank.checked.checker import SHM_VAR
from distnb.session import Session
from harness.processes import NAMED_S

pytestmark = pytest.mark.cluster

# A release takes well under a second (bench/bench_session.py); the bound is NAMED_S's.
RELEASED_S = NAMED_S


@pytest.fixture(scope="module")
def store_session() -> Iterator[Session]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SHM_VAR, "0")  # the engines inherit the kernel's environment, at each start
        with distnb.start(2, progress=False) as s:
            yield s


def test_fingerprints_go_through_the_store(store_session: Session) -> None:
    result = store_session.run(
        "from distnb.rank.checked.installation import _checker\n"
        "x = torch.full((3,), rank + 1.0)\n"
        "dist.all_reduce(x)\n"
        "group = _checker.groups[dist.group.WORLD.group_name]\n"
        "(type(group.board).__name__, x.tolist())"
    )
    for r in (0, 1):
        assert result.result(r) == "('StoreBoard', [3.0, 3.0, 3.0])"


def test_a_mismatch_is_named_through_the_store(store_session: Session) -> None:
    with pytest.raises(CollectiveMismatchError, match=r"rank 0: broadcast\(float32\[2\]"):
        store_session.run("dist.broadcast(torch.zeros(2 + rank), src=0)")
    assert store_session.run("x = torch.ones(1)\ndist.all_reduce(x)\nx.item()").result(1) == "2.0"


@pytest.mark.parametrize("late_s", [3, 125], ids=["seconds", "minutes"])
def test_a_rank_late_by_seconds_or_minutes_is_waited_for(
    store_session: Session, late_s: int
) -> None:
    """Thousands of polls of the store (the wait once overflowed its backoff after ~1,000)."""
    result = store_session.run(
        f"import time\nif rank == 1:\n    time.sleep({late_s})\n"
        "x = torch.full((1,), rank + 1.0)\ndist.all_reduce(x)\nx.item()"
    )
    assert [result.result(r) for r in (0, 1)] == ["3.0", "3.0"]


def test_a_peer_that_finishes_releases_the_waiter(store_session: Session) -> None:
    started = time.monotonic()
    with pytest.raises(CollectiveDesyncError, match="rank 1 finished"):
        store_session.run("x = torch.ones(1)\nif rank == 0:\n    dist.all_reduce(x)")
    assert time.monotonic() - started < RELEASED_S
    assert store_session.run("x = torch.ones(1)\ndist.all_reduce(x)\nx.item()").result(0) == "2.0"


def test_a_peer_that_dies_releases_the_waiter_and_restart_keeps_the_path(
    store_session: Session,
) -> None:
    started = time.monotonic()
    with pytest.raises(RankDiedError, match="rank 1"):
        store_session.run(
            "import os, signal\nx = torch.ones(1)\n"
            "if rank == 1:\n    os.kill(os.getpid(), signal.SIGKILL)\ndist.all_reduce(x)"
        )
    assert time.monotonic() - started < RELEASED_S
    store_session.restart()
    test_fingerprints_go_through_the_store(store_session)
