"""Circular waits from beacons alone: which ranks block each other, and the sentence they raise."""

from __future__ import annotations

from distnb.judgement.circles import cycle_reason, find_cycle
from distnb.records.beacon import Beacon, BeaconState, WaitKind
from distnb.records.collective import CallSite


def waits(
    rank: int, group: str, seq: int, waiting_for: tuple[int, ...], wait_id: int = 1
) -> Beacon:
    return Beacon(
        rank,
        BeaconState.WAITING,
        run_id=7,
        wait_id=wait_id,
        group=f"group[{group}]",
        group_name=group,
        seq=seq,
        op="all_reduce",
        site=CallSite("/tmp/x.py", 3, 5, "dist.all_reduce(x)"),
        waiting_for=waiting_for,
    )


def test_four_ranks_in_a_circle() -> None:
    beacons = [
        waits(2, "1,2", 0, (1,)),
        waits(0, "0,3", 0, (3,)),
        waits(1, "0,1", 0, (0,)),
        waits(3, "2,3", 0, (2,)),
    ]
    cycle = find_cycle(beacons, run_id=7)
    assert cycle is not None and [b.rank for b in cycle] == [0, 3, 2, 1]
    reason = cycle_reason(cycle)
    assert reason.startswith("deadlock: 4 ranks wait for each other in a circle (rank 0 waits in")
    assert "rank 1 waits in all_reduce #0 on group[0,1] at cell In[5] line 3 for rank 0)" in reason


def test_ranks_in_the_same_collective_do_not_block_each_other() -> None:
    # 0 and 1 wait in WORLD #4 for rank 2, which still computes: a straggler, not a deadlock
    beacons = [waits(0, "0", 4, (2,)), waits(1, "0", 4, (2,))]
    assert find_cycle(beacons, run_id=7) is None


def test_a_chain_that_ends_in_a_running_rank_is_not_a_cycle() -> None:
    beacons = [waits(0, "0,1", 0, (1,)), waits(1, "1,2", 0, (2,))]
    assert find_cycle(beacons, run_id=7) is None


def test_beacons_of_another_run_are_ignored() -> None:
    old = Beacon(1, BeaconState.WAITING, run_id=6, group_name="0,1", waiting_for=(0,))
    assert find_cycle([waits(0, "0,2", 0, (1,)), old], run_id=7) is None


def test_two_receives_from_each_other_block() -> None:
    a = Beacon(0, BeaconState.WAITING, 7, kind=WaitKind.RECV, group_name="0", seq=0, op="recv",
               peer=1, waiting_for=(1,))  # fmt: skip
    b = Beacon(1, BeaconState.WAITING, 7, kind=WaitKind.RECV, group_name="0", seq=0, op="recv",
               peer=0, waiting_for=(0,))  # fmt: skip
    cycle = find_cycle([a, b], run_id=7)
    assert cycle is not None
    assert "rank 0 waits in recv #0 from rank 1" in cycle_reason(cycle)
