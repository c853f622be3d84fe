"""Verdicts from a snapshot of every rank: who waits for whom, where, and why. Pure functions over
the records an attached job's agents give (`RankSnapshot`, `CollectiveEvent`, `Fingerprint`),
with the same sentences distnb gives its own ranks:

- a rank in a collective that a peer has not entered is a **waiter**, as with a beacon
  (`beacons`); the peer may have ended (`desync_reason`: "rank 1 ended without calling
  all_reduce #15 on WORLD, which rank 0 waits at train.py:52"), run elsewhere ("rank 1 runs at
  train.py:62 (time.sleep(3600)) without calling ..."), or wait in another call, and then the
  ranks may wait in a circle (`find_cycle`, `cycle_reason`);
- the recorded calls say where the ranks stopped lining up (`skipped_call`: "rank 1 skipped
  all_reduce #7 at train.py:52 (rank 0 called it) ...");
- the recorded fingerprints of one (group, seq) are judged as the checked runtime judges them
  (`match`), except that these calls were not held: they went to the backend.

A snapshot is read while the job runs, so a healthy job is caught mid-collective all the time:
a rank that entered an all_reduce a microsecond before its peer "waits" for it. A wait is only
judged once it has lasted longer than the ranks' own recent waits allow (`patience_s`); a peer
that has ended, and calls that do not fit, need no patience.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from distnb.judgement.circles import cycle_reason, find_cycle
from distnb.judgement.desync import desync_reason, skipped_call
from distnb.judgement.matching import canonical_op, match
from distnb.ranklist import format_ranks
from distnb.records.attach import AgentState, OpenCall, RankSnapshot
from distnb.records.beacon import Beacon, BeaconState
from distnb.records.collective import CollectiveEvent, Fingerprint, Mismatch

__all__ = ["beacons", "mismatches", "patience_s", "verdicts"]

_RUN = 0  # beacons of an attached job all belong to one run
_QUIET = (AgentState.STOPPED, AgentState.HELD)  # waits the notebook made: not a hang
MIN_WAIT_S = 1.0  # no wait shorter than this is judged, whatever the pace
PACE_FACTOR = 10.0  # a wait is judged once it is this many times the ranks' longest recent one
RECENT = 32  # the recent collectives of each rank that give its pace


def patience_s(events: Iterable[CollectiveEvent]) -> float:
    """How long a wait must last before it is judged: `PACE_FACTOR` times the longest of the
    ranks' recent collectives (entered to completed), at least `MIN_WAIT_S`."""
    by_rank: dict[int, list[CollectiveEvent]] = defaultdict(list)
    for e in events:
        if e.end_ns:
            by_rank[e.rank].append(e)
    waits = [
        (e.end_ns - e.arrive_ns) / 1e9
        for es in by_rank.values()
        for e in sorted(es, key=lambda e: e.arrive_ns)[-RECENT:]
    ]
    return max(MIN_WAIT_S, PACE_FACTOR * max(waits, default=0.0))


def beacons(snapshots: Sequence[RankSnapshot]) -> list[Beacon]:
    """A beacon for each rank in a collective: what it waits at, and for which members (those
    that have not entered that collective yet)."""
    entered = {s.rank: dict(s.calls) for s in snapshots if s.source == "agent"}
    # The members that have not entered a call, found once per call: the ranks waiting in one
    # collective all ask about the same members, and asking per rank is N x N at N ranks
    absent: dict[tuple[str, int], tuple[tuple[int, ...], tuple[int, ...]]] = {}
    found = []
    for s in snapshots:
        call = s.current
        if call is None or s.state in _QUIET:
            continue
        at = (call.group_name, call.seq)
        known = absent.get(at)
        if known is None or (known[0] is not call.members and known[0] != call.members):
            known = absent[at] = (call.members, _absent(call, entered))
        missing = tuple(m for m in known[1] if m != s.rank)
        found.append(
            Beacon(
                rank=s.rank,
                state=BeaconState.WAITING,
                run_id=_RUN,
                wait_id=call.seq,
                group=call.group,
                group_name=call.group_name,
                seq=call.seq,
                op=call.op,
                site=call.site,
                waiting_for=missing,
                fingerprint=call.fingerprint,
            )
        )
    return found


def _absent(call: OpenCall, entered: Mapping[int, Mapping[str, int]]) -> tuple[int, ...]:
    """The members of `call` that have not entered it (by the collectives each has entered on
    its group); a rank that never answered has entered none."""
    return tuple(
        m
        for m in call.members
        if m not in entered or entered[m].get(call.group_name, 0) <= call.seq
    )


def verdicts(
    snapshots: Sequence[RankSnapshot],
    events: Mapping[int, Sequence[CollectiveEvent]] = {},
    fingerprints: Mapping[int, Sequence[Fingerprint]] = {},
) -> list[str]:
    """Every verdict the records allow, most telling first; empty when nothing is wrong."""
    found = mismatches(fingerprints)
    out = [m.message for m in found][:3]
    by_rank = {s.rank: s for s in snapshots}
    patience = patience_s(e for es in events.values() for e in es)
    waiting = beacons(snapshots)
    long = {w.rank for w in waiting if _age(by_rank[w.rank]) >= patience}
    blocked = [w for w in waiting if w.waiting_for]
    cycle = find_cycle(blocked, _RUN) if len(blocked) > 1 else None
    if cycle and all(w.rank in long for w in cycle):
        out.append(cycle_reason(cycle))
    elif not cycle:
        out.extend(_desyncs(blocked, by_rank, long))
    if any(w.rank in long for w in blocked):
        skipped = _skipped(events, snapshots, blocked)
        if skipped:
            out.append(skipped)
    judged = {(m.group, m.seq) for m in found}
    inside = [w for w in waiting if not w.waiting_for and w.rank in long]
    for ws in _by_call(inside).values():
        out.extend(_inside(ws, by_rank, judged))
    return out


def _age(s: RankSnapshot) -> float:
    return s.current.age_s if s.current is not None else 0.0


def _desyncs(
    blocked: Sequence[Beacon], by_rank: Mapping[int, RankSnapshot], long: set[int]
) -> list[str]:
    """For each call that ranks wait at: the peers that are absent, in words. A peer that has
    ended is said at once; one that runs elsewhere once the wait is long."""
    out = []
    for ws in _by_call(blocked).values():
        absent = sorted({m for w in ws for m in w.waiting_for})
        words = {m: _absent_words(by_rank.get(m)) for m in absent}
        ended = all(by_rank.get(m) is None or by_rank[m].state is AgentState.GONE for m in absent)
        if all(w is not None for w in words.values()) and (
            ended or any(w.rank in long for w in ws)
        ):
            out.append(desync_reason({m: str(w) for m, w in words.items()}, ws))
    return out


def _absent_words(s: RankSnapshot | None) -> str | None:
    """What an absent peer does instead, as `desync_reason` puts it before "without calling";
    None when it waits in a call of its own (a chain or a circle says more)."""
    if s is None:
        return "does not answer"
    if s.state is AgentState.GONE:
        return s.where or "ended"
    if s.state in _QUIET:
        return f"is {s.state.value} by the notebook"
    if s.current is not None:
        return None
    top = s.stack[-1] if s.stack else None
    if top is None:
        return "runs"
    code = f" ({top.code})" if top.code else ""
    return f"runs at {top.file}:{top.line}{code}"


def _inside(
    ws: Sequence[Beacon], by_rank: Mapping[int, RankSnapshot], judged: set[tuple[str, int]]
) -> list[str]:
    """Ranks long in one (group, seq) that no member is missing from. Different calls there are
    a mismatch (said once: by the recorded fingerprints when they hold it); the same call that
    every member is in and none completes points below Python: the transport."""
    calls = [c for w in ws if (c := by_rank[w.rank].current) is not None]
    first = calls[0]
    if (first.group, first.seq) in judged:
        return []
    if len({canonical_op(c.op) for c in calls}) > 1:
        fps = [c.fingerprint for c in calls if c.fingerprint is not None]
        mismatch = match(fps, held=False) if len(fps) == len(calls) else None
        if mismatch is not None:
            return [mismatch.message]
        return [
            f"ranks in different collectives at #{first.seq} on {first.group}: "
            + "; ".join(f"rank {w.rank} in {c}" for w, c in zip(ws, calls, strict=True))
        ]
    inside = {w.rank for w in ws}
    if set(first.members) - inside:  # a member has left it: the others finish in a moment
        return []
    age = min(c.age_s for c in calls)
    return [
        f"{format_ranks(inside)} {'is' if len(ws) == 1 else 'are'} in {first.op} #{first.seq} "
        f"on {first.group} ({first.site}), which every member has entered; it has not "
        f"completed for {age:.1f} s: the transport, or a peer's output buffer too small for "
        "what it receives"
    ]


def _skipped(
    events: Mapping[int, Sequence[CollectiveEvent]],
    snapshots: Sequence[RankSnapshot],
    blocked: Sequence[Beacon],
) -> str:
    """`skipped_call` over the records, the rank that made the fewest calls tried first: where
    the records alone cannot tell whether one rank skipped a call or its peer made an extra
    one (`skipped_call` names the first rank that fits), the rank behind skipped it."""
    made = {s.rank: sum(n for _, n in s.calls) for s in snapshots}
    order = sorted({*events, *(w.rank for w in blocked)}, key=lambda r: (made.get(r, 0), r))
    recorded = [e for r in order for e in events.get(r, ())]
    return skipped_call(recorded, blocked, {r: i for i, r in enumerate(order)})


def _by_call(ws: Sequence[Beacon]) -> dict[tuple[str, int], list[Beacon]]:
    calls: dict[tuple[str, int], list[Beacon]] = defaultdict(list)
    for w in ws:
        calls[(w.group, w.seq)].append(w)
    return dict(calls)


def mismatches(fingerprints: Mapping[int, Sequence[Fingerprint]]) -> list[Mismatch]:
    """The recorded collectives whose members' fingerprints do not fit (every member's must
    be in the records), in seq order. These calls went to the backend: nothing held them."""
    at: dict[tuple[str, int], dict[int, Fingerprint]] = defaultdict(dict)
    for rank, fps in fingerprints.items():
        for f in fps:
            at[(f.group, f.seq)][rank] = f
    found = []
    for _, calls in sorted(at.items(), key=lambda kv: kv[0][1]):
        members = next(iter(calls.values())).group_ranks
        if set(calls) == set(members):
            mismatch = match(list(calls.values()), held=False)
            if mismatch is not None:
                found.append(mismatch)
    return found
