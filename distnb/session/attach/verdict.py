"""The verdicts on an attached job: who waits for whom, where, and why. Pure functions over the
records the ranks' agents give (`RankSnapshot`, `CollectiveEvent`, `Fingerprint`).

They are the verdicts distnb gives its own ranks, from the same functions:

- a rank in a collective that a peer has not entered is a **waiter**, as with a beacon
  (`beacons`); the peer may have ended (`desync_reason`: "rank 1 ended without calling
  all_reduce #15 on WORLD, which rank 0 waits at train.py:52"), run elsewhere ("rank 1 runs at
  train.py:62 (time.sleep(3600)) without calling ..."), or wait in another call, and then the
  ranks may wait in a circle (`find_cycle`, `cycle_reason`);
- the recorded calls say where the ranks stopped lining up (`skipped_call`: "rank 1 skipped
  all_reduce #7 at train.py:52 (rank 0 called it) ...");
- the recorded fingerprints of one (group, seq) are judged as the checked runtime judges them
  (`distnb.matching.match`): a shape, dtype, op or root mismatch that the backend let through.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace

from distnb import matching
from distnb.ranklist import format_ranks
from distnb.records.attach import AgentState, RankSnapshot
from distnb.records.beacon import Beacon, BeaconState
from distnb.records.collective import CollectiveEvent, Fingerprint, Mismatch
from distnb.session.runs.deadlock import cycle_reason, find_cycle
from distnb.session.runs.referee import desync_reason, skipped_call

__all__ = ["beacons", "mismatches", "verdicts"]

_RUN = 0  # beacons of an attached job all belong to one run
_QUIET = (AgentState.STOPPED, AgentState.HELD)  # waits the notebook made: not a hang


def beacons(snapshots: Sequence[RankSnapshot]) -> list[Beacon]:
    """A beacon for each rank in a collective: what it waits at, and for which members (those
    that have not entered that collective yet)."""
    counts = {s.rank: s for s in snapshots}
    found = []
    for s in snapshots:
        call = s.current
        if call is None or s.state in _QUIET:
            continue
        missing = tuple(
            m
            for m in call.members
            if m != s.rank and _count(counts.get(m), call.group_name) <= call.seq
        )
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


def _count(s: RankSnapshot | None, group_name: str) -> int:
    """Collectives a rank has entered on a group; one that never answered counts as none."""
    return -1 if s is None or s.source != "agent" else s.count(group_name)


def verdicts(
    snapshots: Sequence[RankSnapshot], events: Mapping[int, Sequence[CollectiveEvent]] = {},
    fingerprints: Mapping[int, Sequence[Fingerprint]] = {},
) -> list[str]:  # fmt: skip
    """Every verdict the records allow, most telling first; empty when nothing is wrong."""
    out = [m.message for m in mismatches(fingerprints)][:3]
    waiting = beacons(snapshots)
    by_rank = {s.rank: s for s in snapshots}
    blocked = [w for w in waiting if w.waiting_for]
    cycle = find_cycle(blocked, _RUN) if len(blocked) > 1 else None
    if cycle:
        out.append(cycle_reason(cycle))
    else:
        out.extend(_desyncs(blocked, by_rank))
    if blocked:
        skipped = _skipped(events, snapshots, blocked)
        if skipped:
            out.append(skipped)
    stuck = [w for w in waiting if not w.waiting_for]
    for (group, seq), ws in _by_call(stuck).items():
        ages = [by_rank[w.rank].current for w in ws]
        age = max(a.age_s for a in ages if a is not None)
        out.append(
            f"{format_ranks(w.rank for w in ws)} {'is' if len(ws) == 1 else 'are'} in "
            f"{ws[0].op} #{seq} on {group} ({ws[0].site}) and every member has entered it; "
            f"it has not completed for {age:.1f} s: the transport, or a peer's output buffer "
            "too small for what it receives"
        )
    return out


def _desyncs(blocked: Sequence[Beacon], by_rank: Mapping[int, RankSnapshot]) -> list[str]:
    """For each call that ranks wait at: the peers that are absent, in words."""
    out = []
    for _, ws in _by_call(blocked).items():
        absent = sorted({m for w in ws for m in w.waiting_for})
        words = {m: _absent_words(by_rank.get(m)) for m in absent}
        if all(w is not None for w in words.values()):
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


def _skipped(
    events: Mapping[int, Sequence[CollectiveEvent]],
    snapshots: Sequence[RankSnapshot],
    blocked: Sequence[Beacon],
) -> str:
    """`skipped_call` over the records, the rank that made the fewest calls tried first: where
    the records alone cannot tell whether one rank skipped a call or its peer made an extra
    one (`skipped_call` names the first rank that fits), the rank behind skipped it. Ranks are
    renumbered for the call and named back in its sentence."""
    made = {s.rank: sum(n for _, n in s.calls) for s in snapshots}
    order = sorted({*events, *(w.rank for w in blocked)}, key=lambda r: (made.get(r, 0), r))
    new = {r: i for i, r in enumerate(order)}
    renamed = [replace(e, rank=new[e.rank]) for r in order for e in events.get(r, ())]
    waiting = [replace(w, rank=new[w.rank]) for w in blocked]
    sentence = skipped_call(renamed, waiting)
    return re.sub(r"rank (\d+)", lambda m: f"rank {order[int(m.group(1))]}", sentence)


def _by_call(ws: Sequence[Beacon]) -> dict[tuple[str, int], list[Beacon]]:
    calls: dict[tuple[str, int], list[Beacon]] = defaultdict(list)
    for w in ws:
        calls[(w.group, w.seq)].append(w)
    return dict(calls)


def mismatches(fingerprints: Mapping[int, Sequence[Fingerprint]]) -> list[Mismatch]:
    """The recorded collectives whose members' fingerprints do not fit (every member's must
    be in the records), in seq order."""
    at: dict[tuple[str, int], dict[int, Fingerprint]] = defaultdict(dict)
    for rank, fps in fingerprints.items():
        for f in fps:
            at[(f.group, f.seq)][rank] = f
    found = []
    for _, calls in sorted(at.items(), key=lambda kv: kv[0][1]):
        members = next(iter(calls.values())).group_ranks
        if set(calls) == set(members):
            mismatch = matching.match(list(calls.values()))
            if mismatch is not None:
                found.append(mismatch)
    return found
