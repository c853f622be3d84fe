"""The verdict on ranks that ended, from the last snapshots their agents left (pure)."""

from __future__ import annotations

from distnb.judgement.endings import UNEVEN, endings
from distnb.records.attach import AgentState, OpenCall, RankSnapshot
from distnb.records.collective import CallSite, CollectiveEvent


def event(rank: int, seq: int, line: int) -> CollectiveEvent:
    return CollectiveEvent(
        rank, "WORLD", seq, "all_reduce", 36, CallSite("train.py", line), 1, 2, 3
    )


def final(
    rank: int, where: str, last: CollectiveEvent | None, current: bool = False
) -> RankSnapshot:
    call = OpenCall("WORLD", "", last.seq, last.op, (), last.site) if current and last else None
    return RankSnapshot(
        rank, "vm", 10 + rank, AgentState.GONE, 3, current=call, last=last, where=where
    )


def test_a_rank_that_raised_in_a_call_its_peer_never_made_names_both_and_the_uneven_steps() -> None:
    said = endings(
        {
            0: final(
                0,
                "raised RuntimeError: Connection closed by peer at train.py:59",
                event(0, 6, 59),
                True,
            ),
            1: final(1, "finished its script", event(1, 5, 62)),
            2: final(2, "raised ValueError: bad batch at train.py:40", event(2, 4, 59)),
        },
        4,
    )
    assert said == [
        "rank 0 raised in all_reduce #6 on WORLD at train.py:59: RuntimeError: Connection closed "
        "by peer; rank 1 had finished its script without calling it (last: all_reduce #5 on "
        f"WORLD at train.py:62): {UNEVEN}",
        "rank 2 raised ValueError: bad batch at train.py:40",
        "rank 3 left no word as it ended: killed (SIGKILL, out of memory?) or crashed in native "
        "code",
    ]


def test_ranks_that_all_finished_say_so_and_nothing_known_says_nothing() -> None:
    done = {r: final(r, "finished its script", event(r, 9, 62)) for r in range(2)}
    assert endings(done, 2) == ["every rank finished its script"]
    assert endings({}, 2) == []
