"""Faults across hosts: a rank on another host killed, or its host cut off, mid-cell; the
stop with a host gone, and what it says. What ran there ends by itself: test_lifeline."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable

import pytest

from distnb.errors import DistnbWarning, RankDiedError, SessionError
from distnb.session import Session
from distnb.session.cluster.members import LEFT_CLUSTER
from distnb.session.cluster.teardown import LIFELINE_BOUND_S
from distnb.session.joining import CONNECT_S
from harness.hosts import Host, Lan, missing
from harness.processes import NAMED_S
from tests.multihost.conftest import engines_on, start_on

pytestmark = [
    pytest.mark.multihost,
    pytest.mark.skipif(bool(missing()), reason=f"rehearsal hosts need {missing()}"),
]

STOP_BOUND_S = 15  # a stop asks each host once, in parallel, for at most 5 s
# A cut link is known by 3 s of heartbeat silence, a death by the nanny there at once; the
# bound is tests.conftest's NAMED_S.
WAITS = "import time\nx = torch.ones(1)\nif rank == 1:\n    time.sleep(60)\ndist.all_reduce(x)"


def fault_in(seconds: float, fault: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(seconds), fault()))
    thread.start()
    return thread


def gone_within(host: Host, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while engines_on(host) and time.monotonic() < deadline:
        time.sleep(0.5)
    return engines_on(host) == 0


def lose_rank_1(s: Session, host: Host, fault: str) -> None:
    """Rank 1 (on `host`) killed, or `host` cut off, while rank 0 waits for it mid-cell: named,
    with its host, within `NAMED_S`."""
    victim = s.ranks[1].pid
    started = time.monotonic()
    if fault == "killed":
        thread = fault_in(1.0, lambda: host.ssh(f"kill -9 {victim}"))
    else:
        thread = fault_in(1.0, lambda: host.link(up=False))
    said = rf"rank 1 \(pid {victim} on {host.name}\) left the cluster"
    with pytest.raises(RankDiedError, match=said):
        s.run(WAITS)
    thread.join()
    assert time.monotonic() - started < NAMED_S
    assert s.status().states == ("alive", LEFT_CLUSTER)


@pytest.mark.parametrize("fault", ["killed", "cut off"])
def test_a_rank_lost_on_another_host_mid_cell_is_named_with_its_host(lan: Lan, fault: str) -> None:
    h2, h3 = lan.hosts
    s = start_on(lan, {h2.addr: 1, h3.addr: 1})
    try:
        lose_rank_1(s, h3, fault)
        if fault == "killed":
            report = s.stop()
            assert report.stopped == (0, 1) and report.not_reached == ()
        else:
            with pytest.warns(DistnbWarning, match=f"{h3.addr} did not answer the stop"):
                report = s.stop()
            assert report.stopped == (0,) and report.not_reached == (1,)
            assert f"not reached: rank 1 on h3 ({h3.addr})" in str(report)
    finally:
        h3.link(up=True)
    # what ran on the cut-off host ends by itself (its lifeline: tests/multihost/test_lifeline)
    assert gone_within(h3, 60) and gone_within(h2, 5)


def test_a_stop_with_a_host_cut_off_is_bounded_and_says_so(
    lan: Lan, capsys: pytest.CaptureFixture[str]
) -> None:
    """`%dist_stop` on a real shell: what it stopped and what it could not reach, and its
    warning at the line that ran it (it was distnb/magics.py's)."""
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython

    from distnb.magics import DistMagics

    h2 = lan.hosts[0]
    s = start_on(lan, {h2.addr: 1})
    ip = start_ipython() or get_ipython()
    ip.run_line_magic("load_ext", "distnb")
    magics = next(m for m in ip.magics_manager.registry.values() if isinstance(m, DistMagics))
    magics.session = s
    capsys.readouterr()  # what loading said (once loaded by an earlier test: "already loaded")
    h2.link(up=False)
    try:
        started = time.monotonic()
        with pytest.warns(DistnbWarning, match=f"{h2.addr} did not answer the stop") as said:
            ip.run_line_magic("dist_stop", "")
        assert time.monotonic() - started < STOP_BOUND_S
        assert [w.filename for w in said] == [__file__]  # the caller's line, not distnb's
        said_lines = capsys.readouterr().out.splitlines()
        assert said_lines[0].startswith("distnb: stopped no rank and the controller (")
        assert said_lines[1:] == [
            f"distnb: not reached: rank 0 on h2 ({h2.addr}), which did not answer the stop: "
            f"they end by themselves within {LIFELINE_BOUND_S:.0f} s of losing the kernel"
        ]
    finally:
        magics.session = None
        h2.link(up=True)


def test_hosts_that_cannot_reach_each_other_are_named_at_start(lan: Lan) -> None:
    """A route (as a firewall would) keeps h2 from h3; both still reach the kernel."""
    h2, h3 = lan.hosts
    block = [*h2.inside, "ip", "route", "add", "prohibit", f"{h3.addr}/32"]
    subprocess.run(block, check=True)
    try:
        started = time.monotonic()
        with pytest.raises(SessionError, match="cannot connect to each other") as info:
            start_on(lan, {h2.addr: 1, h3.addr: 1})
        # named, not gloo's 10-minute timeout: a bound far from a busy machine's minutes
        assert time.monotonic() - started < CONNECT_S["gloo"] + 240
        said = str(info.value)
        assert f"rank 0 on h2 listens on {h2.addr}" in said
        assert f"rank 1 on h3 listens on {h3.addr}" in said and "GLOO_SOCKET_IFNAME" in said
    finally:
        subprocess.run([*h2.inside, "ip", "route", "del", "prohibit", f"{h3.addr}/32"])
    assert gone_within(h2, NAMED_S) and gone_within(h3, NAMED_S)
