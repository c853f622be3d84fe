"""The two-level exchange between real hosts: 2 ranks on each of h2 and h3, over ssh.

Each rehearsal host has its own /dev/shm, network and host name (`hosts.Lan`), so the ranks of a
host meet in their own shared memory and the two leaders through the kernel's store, signed
as every value off loopback. tests/session/cluster/test_tiers.py covers 8 ranks rehearsed on one
machine (`DISTNB_SHM=k`); this is the same exchange across a network.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from distnb.errors import CollectiveDesyncError, CollectiveMismatchError
from distnb.session import Session
from harness.hosts import Lan, missing
from harness.processes import NAMED_S
from tests.multihost.conftest import start_on

pytestmark = [
    pytest.mark.multihost,
    pytest.mark.skipif(bool(missing()), reason=f"rehearsal hosts need {missing()}"),
]


@pytest.fixture(scope="module")
def two_by_two(lan: Lan) -> Iterator[Session]:
    with start_on(lan, {h.addr: 2 for h in lan.hosts}) as s:
        yield s


def test_two_hosts_of_two_agree_through_their_leaders(two_by_two: Session) -> None:
    result = two_by_two.run(
        "import socket\nfrom distnb.rank.checked.installation import _checker\n"
        "x = torch.full((2,), rank + 1.0)\nfor _ in range(10):\n    dist.all_reduce(x)\n"
        "tiers = _checker.groups[dist.group.WORLD.group_name].tiers\n"
        "(socket.gethostname(), tiers.hosts, tiers.leader)"
    )
    hosts = [result.result(r) for r in range(4)]
    assert {h.split("'")[1] for h in hosts} == {"h2", "h3"}
    assert all("[[0, 1], [2, 3]]" in h for h in hosts)
    assert [h.endswith("True)") for h in hosts] == [True, False, True, False]


def test_a_mismatch_on_the_other_host_names_every_rank(two_by_two: Session) -> None:
    with pytest.raises(CollectiveMismatchError) as caught:
        two_by_two.run("dist.broadcast(torch.zeros(2 + (rank == 3)), src=0)")
    message = str(caught.value)
    assert "rank 3: broadcast(float32[3], src=0)" in message
    assert all(f"rank {r}: broadcast(float32[2], src=0)" in message for r in (0, 1, 2))
    result = two_by_two.run("y = torch.ones(1)\ndist.all_reduce(y)\ny.item()")
    assert {result.result(r) for r in range(4)} == {"4.0"}


def test_a_rank_that_finishes_on_the_other_host_releases_the_rest(two_by_two: Session) -> None:
    started = time.monotonic()
    with pytest.raises(CollectiveDesyncError, match="rank 3 finished the cell without calling"):
        two_by_two.run("x = torch.ones(1)\nif rank != 3:\n    dist.all_reduce(x)")
    assert time.monotonic() - started < NAMED_S
    result = two_by_two.run("y = torch.ones(1)\ndist.all_reduce(y)\ny.item()")
    assert {result.result(r) for r in range(4)} == {"4.0"}
