"""The referee's sentences, from records alone."""

from __future__ import annotations

from distnb.judgement.desync import desync_reason, skipped_call
from distnb.records.beacon import Beacon, BeaconState
from distnb.records.collective import CallSite, CollectiveEvent


def event(rank: int, seq: int, line: int, cell: int = 5) -> CollectiveEvent:
    site = CallSite("/tmp/x.py", line, cell, "dist.all_reduce(x)")
    return CollectiveEvent(rank, "WORLD", seq, "all_reduce", 8, site, 0, 0, 0, run_id=1)


def beacon(rank: int, seq: int, line: int) -> Beacon:
    site = CallSite("/tmp/x.py", line, 5, "dist.all_reduce(x)")
    return Beacon(rank, BeaconState.WAITING, 1, group="WORLD", seq=seq, op="all_reduce", site=site)


def test_a_beacon_survives_json() -> None:
    b = beacon(0, 3, 5)
    assert Beacon.from_json(b.to_json()) == b


def test_desync_reason_names_who_is_done_and_where_the_others_wait() -> None:
    reason = desync_reason({1: "finished the cell"}, [beacon(0, 3, 5)])
    assert reason == (
        "rank 1 finished the cell without calling all_reduce #3 on WORLD, "
        "which rank 0 waits at cell In[5] line 5"
    )


def test_a_skip_is_named_with_both_call_sites() -> None:
    # rank 0: line 3 (#0), line 4 (#1, waiting); rank 1 skipped line 3: its #0 is line 4
    events = [event(0, 0, 3), event(1, 0, 4)]
    text = skipped_call(events, [beacon(0, 1, 4)])
    assert text == (
        "rank 1 skipped all_reduce #0 at cell In[5] line 3 (rank 0 called it); "
        "rank 1's #0 was its call at cell In[5] line 4"
    )


def test_an_early_stop_in_a_loop_is_not_a_skip() -> None:
    events = [event(r, s, 5) for r in (0, 1) for s in (0, 1)]
    assert skipped_call(events, [beacon(0, 2, 5)]) == ""


def test_diverging_sites_without_a_skip_are_listed() -> None:
    text = skipped_call([event(0, 0, 3), event(1, 0, 7)])
    assert text == (
        "the ranks' collectives stop lining up at #0 on WORLD: "
        "rank 0 at cell In[5] line 3, rank 1 at cell In[5] line 7"
    )


def test_where_several_ranks_fit_the_first_in_the_order_given_is_named() -> None:
    # ranks 0 and 2 called line 3 then line 4; rank 1 called line 4 at #0 and line 3 at #1:
    # rank 1 skipped line 3, or ranks 0 and 2 skipped line 4 (the records cannot tell)
    events = [event(r, s, 3 + (s + (r == 1)) % 2) for r in (0, 1, 2) for s in (0, 1)]
    by_rank = skipped_call(events)
    assert by_rank.startswith("rank 0 skipped all_reduce #0 at cell In[5] line 4 (rank 1 ")
    behind_first = skipped_call(events, order={1: 0, 0: 1, 2: 2})
    assert behind_first.startswith("rank 1 skipped all_reduce #0 at cell In[5] line 3 (rank 0 ")


def test_many_ranks_at_two_sites_are_listed_by_their_own_numbers_in_any_order() -> None:
    at_7 = {3, 5}
    events = [event(r, 0, 7 if r in at_7 else 3) for r in range(12)]
    expected = (
        "the ranks' collectives stop lining up at #0 on WORLD: ranks 0-2,4,6-11 at cell In[5] "
        "line 3, ranks 3,5 at cell In[5] line 7"
    )
    assert skipped_call(events) == expected
    assert skipped_call(events, order={r: (r - 5) % 12 for r in range(12)}) == (
        "the ranks' collectives stop lining up at #0 on WORLD: ranks 3,5 at cell In[5] line 7, "
        "ranks 0-2,4,6-11 at cell In[5] line 3"
    )
