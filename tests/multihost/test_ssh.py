"""Ranks on another host, started over ssh as a user would: `distnb.start(hosts=..., host=...)`.

The other host is a rehearsal one (`hosts.SecondHost`: its own network, host name, PIDs, /tmp,
home and /dev/shm, an sshd), reached on addresses the test makes; skipped where the machine
cannot make one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

import distnb
from distnb.errors import CollectiveMismatchError, DistnbWarning
from distnb.session import Session
from tests.multihost.hosts import SecondHost, missing

pytestmark = [
    pytest.mark.multihost,
    pytest.mark.skipif(bool(missing()), reason=f"a rehearsal host needs {missing()}"),
]

# A stop asks each host once, in parallel, for at most 5 s (distnb.session.remote); a loaded
# machine gets room on top.
STOP_BOUND_S = 15


@pytest.fixture(scope="module")
def h2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecondHost]:
    host = SecondHost(tmp_path_factory.mktemp("h2"))
    yield host
    host.close()


def start_on(host: SecondHost, ranks: int = 2) -> Session:
    return distnb.start(
        hosts={host.addr: ranks}, host=host.local_addr, ssh_args=host.ssh_args, progress=False
    )


def test_ranks_start_on_the_other_host_and_leave_nothing_there(h2: SecondHost) -> None:
    s = start_on(h2)
    try:
        result = s.run(
            "import os, socket\nx = torch.full((2,), rank + 1.0)\ndist.all_reduce(x)\n"
            "(socket.gethostname(), os.environ['GLOO_SOCKET_IFNAME'], x.tolist())"
        )
        for r in (0, 1):  # gloo on the interface that reaches the kernel, not the host name's
            assert result.result(r) == f"('h2', '{h2.remote_if}', [3.0, 3.0])"
        assert len([p for p in h2.processes() if "distnb.rank.engine" in p]) == 2
        with pytest.raises(CollectiveMismatchError, match=r"rank 1: all_reduce\(float32\[3\]"):
            s.run("dist.all_reduce(torch.ones(2 + rank))")
    finally:
        started = time.monotonic()
        s.stop()
    assert time.monotonic() - started < STOP_BOUND_S
    assert h2.processes() == []
    assert [p.name for p in h2.tmp.iterdir()] == ["sshd"]  # the profile copy removed too


def test_a_stop_with_the_host_cut_off_is_bounded_and_says_so(h2: SecondHost) -> None:
    s = start_on(h2)
    h2.link(up=False)
    try:
        started = time.monotonic()
        with pytest.warns(DistnbWarning, match=f"{h2.addr} did not answer the stop"):
            s.stop()
        assert time.monotonic() - started < STOP_BOUND_S
    finally:
        h2.link(up=True)
