"""The notebook's copy of each attached rank's tape (`AttachedJob.events`): what a rank answers
replaces the copy from where it was asked, a verdict asks only from the first call not ended,
and a rank whose agent started again starts its copy over. Pure records, no job."""

from __future__ import annotations

from distnb.records.agent import Recorded, Taped
from distnb.records.collective import CallSite, CollectiveEvent, Fingerprint
from distnb.session.attach.job import TAPE_KEPT, _asked_from, _kept


def call(seq: int, ended: bool = True) -> Recorded:
    site = CallSite("train.py", 9)
    end = 30 + seq if ended else 0
    event = CollectiveEvent(0, "WORLD", seq, "all_reduce", 16, site, 10 + seq, 20 + seq, end)
    return Recorded(event, Fingerprint(0, "WORLD", seq, "all_reduce"))


def test_a_copy_asks_from_its_first_call_not_ended_and_takes_its_end_when_it_comes() -> None:
    copy = _kept(None, Taped(3, 0, (call(0), call(1), call(2, ended=False))))
    assert _asked_from(copy) == 2  # the open call is asked for again
    copy = _kept(copy, Taped(5, 2, (call(2), call(3), call(4))))
    assert [r.event.seq for r in copy[1]] == [0, 1, 2, 3, 4]
    assert all(r.event.end_ns for r in copy[1]) and _asked_from(copy) == 5
    copy = _kept(copy, Taped(5, 5, ()))  # a hung rank: nothing new moves
    assert _asked_from(copy) == 5 and len(copy[1]) == 5


def test_a_copy_keeps_the_last_calls_and_starts_over_for_an_agent_started_again() -> None:
    many = tuple(call(i) for i in range(TAPE_KEPT + 10))
    copy = _kept(None, Taped(len(many), 0, many))
    assert copy[0] == 10 and len(copy[1]) == TAPE_KEPT and _asked_from(copy) == TAPE_KEPT + 10
    again = _kept(copy, Taped(2, 0, (call(0), call(1))))  # its count went back: a new agent
    assert again == (0, [call(0), call(1)])
    # more calls than the rank keeps came since: the rank answers from its oldest
    jumped = _kept((0, [call(0)]), Taped(5000, 4000, (call(4000),)))
    assert jumped == (4000, [call(4000)])
