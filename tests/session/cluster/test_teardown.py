"""What a stop says it did (`distnb.session.cluster.teardown`): pure, from ranks and the hosts
that did not answer."""

from __future__ import annotations

from distnb.records.cell import RankInfo
from distnb.session.cluster.teardown import LIFELINE_BOUND_S, teardown_report


def rank(r: int, host: str, launched_on: str = "") -> RankInfo:
    return RankInfo(r, r % 2, r, host, 100 + r, "cpu", "gloo", "", launched_on)


def test_a_stop_that_reached_every_host_names_them() -> None:
    report = teardown_report([rank(0, "vm"), rank(1, "vm")], [], 5)
    assert str(report) == "stopped ranks 0-1 on vm and the controller (5 processes on this machine)"
    two = teardown_report([rank(r, f"h{r // 2}", f"10.0.0.{r // 2}") for r in range(4)], [], 9)
    assert str(two).startswith(
        "stopped ranks 0-3 (ranks 0-1 on h0 (10.0.0.0); ranks 2-3 on h1 (10.0.0.1)) and the "
    )
    assert two.not_reached == ()


def test_ranks_on_a_host_that_did_not_answer_are_not_counted_as_stopped() -> None:
    ranks = [rank(r, f"h{r // 2}", f"root@10.0.0.{r // 2}") for r in range(4)]
    report = teardown_report(ranks, ["root@10.0.0.1"], 5)
    assert report.stopped == (0, 1) and report.not_reached == (2, 3)
    assert str(report).splitlines() == [
        "stopped ranks 0-1 on h0 (root@10.0.0.0) and the controller (5 processes on this machine)",
        f"not reached: ranks 2-3 on h1 (root@10.0.0.1), which did not answer the stop: they end "
        f"by themselves within {LIFELINE_BOUND_S:.0f} s of losing the kernel",
    ]
    left = teardown_report(ranks[:2], ["node9"], 3, [4242])  # a host no rank reported from
    assert str(left).splitlines()[1:] == [
        f"not reached: node9, which did not answer the stop: they end by themselves within "
        f"{LIFELINE_BOUND_S:.0f} s of losing the kernel",
        "still running here: pids 4242",
    ]
