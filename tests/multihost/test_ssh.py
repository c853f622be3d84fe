"""Ranks on other hosts, started over ssh as a user would: `distnb.start(hosts=..., host=...)`.

The hosts are rehearsal ones (`hosts.Lan`: each with its own network, host name, PIDs, /tmp,
home and /dev/shm, and an sshd, behind a router), on addresses the test makes; skipped where
the machine cannot make them.
"""

from __future__ import annotations

import ast
import time
from collections.abc import Iterator

import pytest

from distnb.errors import (
    CollectiveDesyncError,
    CollectiveMismatchError,
)
from distnb.session import Session
from harness.hosts import Lan, missing
from harness.processes import NAMED_S
from tests.multihost.conftest import engines_on, forked_on, start_on

pytestmark = [
    pytest.mark.multihost,
    pytest.mark.skipif(bool(missing()), reason=f"rehearsal hosts need {missing()}"),
]

STOP_BOUND_S = 15  # a stop asks each host once, in parallel, for at most 5 s


def test_ranks_start_on_another_host_and_leave_nothing_there(lan: Lan) -> None:
    h2 = lan.hosts[0]
    s = start_on(lan, {h2.addr: 2})
    try:
        result = s.run(
            "import os, socket\nx = torch.full((2,), rank + 1.0)\ndist.all_reduce(x)\n"
            "(socket.gethostname(), os.environ['GLOO_SOCKET_IFNAME'], x.tolist())"
        )
        for r in (0, 1):  # gloo on the interface that reaches the kernel, not the host name's
            assert result.result(r) == f"('h2', '{h2.remote_if}', [3.0, 3.0])"
        assert engines_on(h2) == 2
    finally:
        started = time.monotonic()
        s.stop()
    assert time.monotonic() - started < STOP_BOUND_S
    assert h2.processes() == []
    assert not list(h2.tmp.glob("distnb-profile-*"))  # the profile copy removed too


def test_the_engines_of_a_host_are_forked_by_one_process_that_imported_torch(lan: Lan) -> None:
    """A start at 2 hosts of 2: one forker per host (`distnb.rank.forks`), the parent of the
    host's engines, which inherit its torch (one import per host, not per rank); the stop ends
    the forkers too."""
    s = start_on(lan, {h.addr: 2 for h in lan.hosts})
    try:
        result = s.run(
            "import os, socket, sys\n"
            "maps = open(f'/proc/{os.getppid()}/maps').read()\n"
            "(socket.gethostname(), os.getppid(), id(sys.modules['torch']), 'libtorch' in maps)"
        )
        seen = [ast.literal_eval(result.result(r)) for r in range(4)]
        for host, ranks in zip(lan.hosts, ((0, 1), (2, 3)), strict=True):
            (forker, engines), *others = forked_on(host).items()
            assert not others and sorted(engines) == sorted(s.ranks[r].pid for r in ranks)
            names, parents, modules, loaded = zip(*(seen[r] for r in ranks), strict=True)
            assert set(names) == {host.name} and set(parents) == {forker}
            assert len(set(modules)) == 1 and all(loaded)  # one torch, the forker's
            assert not [p for p in host.processes() if "distnb.rank.engine" in p]
    finally:
        s.stop()
    assert all(h.processes() == [] for h in lan.hosts)


@pytest.fixture(scope="module")
def two_hosts(lan: Lan) -> Iterator[Session]:
    """One rank on each of h2 and h3."""
    with start_on(lan, {h.addr: 1 for h in lan.hosts}) as s:
        yield s


def test_ranks_on_two_hosts_reduce_together_and_check_through_the_store(
    two_hosts: Session,
) -> None:
    result = two_hosts.run(
        "import socket\nfrom distnb.rank.checked.installation import _checker\n"
        "x = torch.full((3,), rank + 1.0)\ndist.all_reduce(x)\n"
        "board = _checker.groups[dist.group.WORLD.group_name].board\n"
        "(socket.gethostname(), type(board).__name__, x.tolist())"
    )
    assert result.result(0) == "('h2', 'StoreBoard', [3.0, 3.0, 3.0])"
    assert result.result(1) == "('h3', 'StoreBoard', [3.0, 3.0, 3.0])"


def test_a_mismatch_across_hosts_names_each_rank_call(two_hosts: Session) -> None:
    with pytest.raises(CollectiveMismatchError, match=r"rank 1: broadcast\(float32\[3\]"):
        two_hosts.run("dist.broadcast(torch.zeros(2 + rank), src=0)")
    late = two_hosts.run(  # a rank seconds late across hosts is waited for
        "import time\nif rank == 1:\n    time.sleep(3)\nx = torch.ones(1)\ndist.all_reduce(x)\n"
        "x.item()"
    )
    assert late.result(0) == "2.0"


def test_a_rank_that_finishes_releases_its_peer_on_the_other_host(two_hosts: Session) -> None:
    started = time.monotonic()
    with pytest.raises(CollectiveDesyncError, match="rank 1 finished"):
        two_hosts.run("x = torch.ones(1)\nif rank == 0:\n    dist.all_reduce(x)")
    assert time.monotonic() - started < NAMED_S  # released, not left hanging
    assert two_hosts.run("x = torch.ones(1)\ndist.all_reduce(x)\nx.item()").result(1) == "2.0"


def test_status_groups_the_ranks_by_host(lan: Lan, two_hosts: Session) -> None:
    h2, h3 = lan.hosts
    hosts = two_hosts.status().hosts()
    assert hosts == [("h2", h2.addr, "rank 0", "1", "-"), ("h3", h3.addr, "rank 1", "1", "-")]


def test_the_timeline_shows_hosts_on_one_clock(two_hosts: Session) -> None:
    two_hosts.run("x = torch.ones(1)\nfor _ in range(3):\n    dist.all_reduce(x)")
    view = two_hosts.timeline(cells=1)
    assert view.timeline.offsets_applied and view.timeline.hosts == {0: "h2", 1: "h3"}
    assert view.timeline.who(1) == "rank 1 (h3)"
    # the text names ranks with their hosts wherever it names them: which rank arrived last
    # (the waits' table) is up to the machine, so either may be the one shown
    text = repr(view)
    assert "rank 0 (h2)" in text or "rank 1 (h3)" in text, text
