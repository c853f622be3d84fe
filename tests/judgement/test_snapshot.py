"""Verdicts on a snapshot of every rank (an attached job's), as pure functions: each says only
what its evidence shows. A healthy job caught mid-collective gets none; calls that went to the
backend are not said to have been held; a mismatch is said once."""

from __future__ import annotations

from distnb.judgement import snapshot
from distnb.judgement.mismatch import UNCHECKED
from distnb.records.attach import AgentState, OpenCall, RankSnapshot, StackFrame
from distnb.records.collective import CallSite, CollectiveEvent, Fingerprint, TensorSpec

SITE = CallSite("train.py", 52)
ELSEWHERE = StackFrame("train.py", 62, "main", "time.sleep(3600)")


def call(rank: int, seq: int, op: str = "all_reduce", age_s: float = 0.0, shape=(8,)) -> OpenCall:
    fp = Fingerprint(
        rank, "WORLD", seq, op, (TensorSpec(shape, "float32"),), group_ranks=(0, 1), site=SITE
    )
    return OpenCall("WORLD", "0", seq, op, (0, 1), SITE, age_s=age_s, fingerprint=fp)


def rank(r: int, entered: int, current: OpenCall | None = None, **kw) -> RankSnapshot:
    state = AgentState.COLLECTIVE if current is not None else AgentState.RUNNING
    return RankSnapshot(
        r,
        "host",
        100 + r,
        kw.pop("state", state),
        2,
        r,
        current=current,
        calls=(("0", entered),),
        **kw,
    )


def paced(ms: float, n: int = 40) -> dict[int, list[CollectiveEvent]]:
    """Each rank's last `n` collectives, each taking `ms`."""
    return {
        r: [
            CollectiveEvent(
                r,
                "WORLD",
                s,
                "all_reduce",
                32,
                SITE,
                s * 10**8,
                s * 10**8,
                s * 10**8 + int(ms * 1e6),
            )
            for s in range(n)
        ]
        for r in (0, 1)
    }


def test_a_healthy_job_caught_mid_collective_gets_no_verdict() -> None:
    # both ranks inside all_reduce #43, entered a moment ago
    both_in = [rank(0, 44, call(0, 43)), rank(1, 44, call(1, 43))]
    assert snapshot.verdicts(both_in, paced(2.0)) == []
    # rank 0 entered it a microsecond before rank 1, which still computes
    one_in = [rank(0, 44, call(0, 43)), rank(1, 43, stack=(ELSEWHERE,))]
    assert snapshot.verdicts(one_in, paced(2.0)) == []


def test_a_wait_is_judged_once_it_outlasts_the_ranks_own_pace() -> None:
    long = [rank(0, 44, call(0, 43, age_s=5.0)), rank(1, 43, stack=(ELSEWHERE,))]
    assert snapshot.verdicts(long, paced(2.0)) == [
        "rank 1 runs at train.py:62 (time.sleep(3600)) without calling all_reduce #43 on WORLD, "
        "which rank 0 waits at train.py:52"
    ]
    # a job whose collectives take 0.8 s each: 5 s is not yet long
    assert snapshot.verdicts(long, paced(800.0)) == []
    assert snapshot.patience_s(e for es in paced(800.0).values() for e in es) == 8.0
    assert snapshot.patience_s([]) == snapshot.MIN_WAIT_S


def test_a_peer_that_ended_is_named_at_once() -> None:
    gone = [rank(0, 44, call(0, 43)), rank(1, 43, state=AgentState.GONE, where="exit code 1")]
    assert snapshot.verdicts(gone) == [
        "rank 1 exit code 1 without calling all_reduce #43 on WORLD, which rank 0 waits at "
        "train.py:52"
    ]


def test_calls_that_went_to_the_backend_are_not_said_to_be_held() -> None:
    fps = {r: [call(r, 5, shape=(8,) if r == 0 else (4,)).fingerprint] for r in (0, 1)}
    (found,) = snapshot.verdicts([rank(0, 6), rank(1, 6)], {}, fps)  # type: ignore[misc]
    assert found.startswith("shape mismatch in all_reduce #5 on WORLD")
    assert "Nothing was sent" not in found and "still works" not in found
    assert found.endswith(UNCHECKED)


def test_ranks_in_different_calls_at_one_seq_are_a_mismatch_said_once() -> None:
    # rank 0 in broadcast #6, rank 1 in a barrier it made its #6: both have "entered" #6
    snaps = [
        rank(0, 7, call(0, 6, "broadcast", age_s=30.0)),
        rank(1, 7, call(1, 6, "barrier", age_s=30.0, shape=())),
    ]
    fps = {s.rank: [s.current.fingerprint] for s in snaps if s.current and s.current.fingerprint}
    found = snapshot.verdicts(snaps, paced(2.0), fps)
    assert len(found) == 1, found
    assert found[0].startswith("op type mismatch in broadcast/barrier #6 on WORLD")
    assert "every member has entered" not in "\n".join(found)
    # without the recorded fingerprints, the open calls' own say the same
    assert snapshot.verdicts(snaps, paced(2.0)) == found


def test_a_call_every_member_is_in_that_never_completes_points_below_python() -> None:
    stuck = [rank(0, 44, call(0, 43, age_s=30.0)), rank(1, 44, call(1, 43, age_s=29.0))]
    (found,) = snapshot.verdicts(stuck, paced(2.0))
    assert found.startswith("ranks 0-1 are in all_reduce #43 on WORLD (train.py:52), which every")
    assert "for 29.0 s: the transport" in found


class Members(tuple[int, ...]):
    """A call's members that count how often they are read through."""

    reads = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        Members.reads += 1
        return super().__iter__()


def test_a_hang_of_thousands_of_ranks_reads_each_call_s_members_once() -> None:
    # rank 1 left the loop; the 4,095 others wait for it in all_reduce #43, entered long ago
    n = 4096
    members = Members(range(n))
    waiting = OpenCall("WORLD", "0", 43, "all_reduce", members, SITE, age_s=30.0)
    snaps = [rank(1, 43, stack=(ELSEWHERE,))]
    snaps += [rank(r, 44, waiting) for r in range(n) if r != 1]
    Members.reads = 0
    found = snapshot.beacons(snaps)
    assert Members.reads == 1  # not once per waiting rank: n x n at n ranks
    assert [b.rank for b in found] == [0, *range(2, n)]
    assert all(b.waiting_for == (1,) for b in found)
    assert snapshot.verdicts(snaps, paced(2.0)) == [
        "rank 1 runs at train.py:62 (time.sleep(3600)) without calling all_reduce #43 on WORLD, "
        f"which ranks 0,2-{n - 1} wait at train.py:52"
    ]


def test_the_skip_among_many_ranks_names_the_ranks_by_their_own_numbers() -> None:
    # 12 ranks waiting in all_reduce #1 for a 13th that never answered; ranks 3 and 5 made
    # their #0 at another line, and nothing says which call was skipped: the sites are listed,
    # by the ranks' own numbers
    line_7, line_9 = CallSite("train.py", 7), CallSite("train.py", 9)
    events = {
        r: [CollectiveEvent(r, "WORLD", 0, "all_reduce", 32, line_7 if r in (3, 5) else SITE,
                            0, 0, 10**6)]
        for r in range(12)
    }  # fmt: skip
    at_1 = OpenCall("WORLD", "0", 1, "all_reduce", (*range(12), 12), line_9, age_s=30.0)
    snaps = [rank(r, 2 + (r < 6), at_1) for r in range(12)]  # ranks 6-11 behind: tried first
    found = snapshot.verdicts(snaps, events)
    assert found[-1] == (
        "the ranks' collectives stop lining up at #0 on WORLD: ranks 0-2,4,6-11 at train.py:52, "
        "ranks 3,5 at train.py:7"
    )
