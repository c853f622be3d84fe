"""The two-level exchange on real ranks: 8 ranks as 2 hosts of 4, as 4 hosts of 2, as one host
of 8 (where, from `groups.FLAT_MAX` ranks on, members wait for their leader too), and as 8
hosts of 1, where the leaders agree by dissemination (as from `tiered.SPREAD_HOSTS` hosts on;
`DISTNB_SPREAD_HOSTS=8` here).

`DISTNB_SHM=k` makes each k ranks a rehearsal host: shared memory within, the store between,
one leader per host (`distnb.rank.checked.exchange.tiered`). A mismatch, a rank that finishes
without calling, a deadlock across hosts and a death are named as precisely as on one host
(tests/session/runs/test_checked_cells.py), through the leaders.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

import distnb
from distnb.errors import CollectiveDesyncError, CollectiveMismatchError, RankDiedError
from distnb.rank.checked.checker import SHM_VAR
from distnb.rank.checked.exchange.tiered import SPREAD_VAR
from distnb.session import Session
from harness.processes import NAMED_S

pytestmark = pytest.mark.cluster

WORLD = 8


@pytest.fixture(
    scope="module",
    params=[4, 2, 8, 1],
    ids=["2 hosts of 4", "4 hosts of 2", "1 host of 8", "8 hosts of 1"],
)
def hosts(request: pytest.FixtureRequest) -> Iterator[tuple[Session, int]]:
    per_host: int = request.param
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SHM_VAR, str(per_host))  # the engines inherit it at start
        if per_host == 1:  # 8 hosts: the leaders agree by dissemination, as from SPREAD_HOSTS
            mp.setenv(SPREAD_VAR, "8")
        with distnb.start(WORLD, progress=False) as s:
            yield s, per_host


def all_reduce_works(session: Session) -> None:
    result = session.run("y = torch.ones(1)\ndist.all_reduce(y)\ny.item()")
    assert {result.result(r) for r in range(WORLD)} == {f"{WORLD}.0"}


def test_every_rank_agrees_through_its_host_leader(hosts: tuple[Session, int]) -> None:
    session, per_host = hosts
    result = session.run(
        "from distnb.rank.checked.installation import _checker\n"
        "x = torch.full((3,), rank + 1.0)\n"
        "for _ in range(20):\n    dist.all_reduce(x)\n"
        "tiers = _checker.groups[dist.group.WORLD.group_name].tiers\n"
        "(type(tiers).__name__, tiers.hosts, tiers.leader, tiers.rounds, x[0].item() > 0)"
    )
    layout = [list(range(h, h + per_host)) for h in range(0, WORLD, per_host)]
    rounds = 3 if per_host == 1 else 1  # 8 hosts: the leaders agree in log2 8 rounds
    for r in range(WORLD):
        assert result.result(r) == f"('Tiers', {layout}, {r % per_host == 0}, {rounds}, True)"


def test_a_mismatch_on_another_host_names_every_rank(hosts: tuple[Session, int]) -> None:
    session, _ = hosts
    with pytest.raises(CollectiveMismatchError) as caught:
        session.run("dist.broadcast(torch.zeros(2 + (rank == 5)), src=0)")
    message = str(caught.value)
    assert "rank 5: broadcast(float32[3], src=0)" in message
    for r in (0, 1, 4, 6, 7):  # every rank's call is there, as on one host
        assert f"rank {r}: broadcast(float32[2], src=0)" in message
    all_reduce_works(session)


def test_a_rank_that_finishes_releases_every_host(hosts: tuple[Session, int]) -> None:
    session, _ = hosts
    started = time.monotonic()
    with pytest.raises(CollectiveDesyncError, match=r"rank 6 finished the cell without calling"):
        session.run("x = torch.ones(1)\nif rank != 6:\n    dist.all_reduce(x)")
    assert time.monotonic() - started < NAMED_S
    all_reduce_works(session)


def test_ranks_on_two_hosts_waiting_for_each_other_are_named(hosts: tuple[Session, int]) -> None:
    session, _ = hosts
    code = (
        "g = dist.new_group([1, 5])\nx = torch.ones(2)\n"
        "dist.all_reduce(x, group=g if rank == 1 else None)"
    )
    started = time.monotonic()
    with pytest.raises((CollectiveMismatchError, CollectiveDesyncError)) as caught:
        session.run(code)
    assert time.monotonic() - started < NAMED_S
    message = str(caught.value)
    assert "rank 1" in message and "rank 5" in message
    all_reduce_works(session)


def test_a_death_on_another_host_is_named(hosts: tuple[Session, int]) -> None:
    session, _ = hosts
    started = time.monotonic()
    with pytest.raises(RankDiedError, match="rank 6"):
        session.run(
            "import os, signal\nx = torch.ones(1)\n"
            "if rank == 6:\n    os.kill(os.getpid(), signal.SIGKILL)\ndist.all_reduce(x)"
        )
    assert time.monotonic() - started < NAMED_S
