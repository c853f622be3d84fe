"""Why ranks wait for peers that will not come: the sentences every waiter raises with.

Pure functions over records. `desync_reason` names the peers that ended (finished, raised, died,
quit the debugger) without calling the collective the others wait at; `outside_reason` the peers
that do not run the cell at all (`--ranks`); `skipped_call` reads the ranks' recorded calls for
where they stopped lining up ("rank 1 skipped all_reduce #7 at ..."). Used alike by the kernel's
referee for cells and scripts (`distnb.session.runs.referee`) and by the verdicts on an attached
job (`distnb.judgement.snapshot`).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence

from distnb.ranklist import GROUP_FROM, format_ranks, same_ranks
from distnb.records.beacon import Beacon
from distnb.records.cell import RankState
from distnb.records.collective import CollectiveEvent

__all__ = ["DDP_HINT", "desync_reason", "done_words", "outside_reason", "skipped_call"]

DDP_HINT = (
    "a rank reduces a DDP bucket once every parameter in it has its gradient: a rank that ran "
    "fewer backward passes than its peers, or whose forward left some of the bucket's "
    "parameters unused, never reduces it (DDP(model, find_unused_parameters=True) handles "
    "parameters unused on some steps)"
)
DONE_WORDS = {
    RankState.FINISHED: "finished {noun}",
    RankState.FAILED: "raised {error}",
    RankState.DIED: "died",
}


def desync_reason(done: Mapping[int, str], waiters: Sequence[Beacon]) -> str:
    """The sentence every waiter raises with: who is done, and what the others wait at."""
    first = waiters[0]
    where = f" at {first.site}" if first.site is not None else ""
    ended = sorted(done.items())
    if len(done) + len(waiters) >= GROUP_FROM:  # ranks that ended alike: one part
        absent = ", ".join(f"{format_ranks(rs)} {what}" for rs, what in same_ranks(ended))
    else:
        absent = ", ".join(f"{format_ranks([r])} {what}" for r, what in ended)
    waiting = format_ranks(w.rank for w in waiters)
    origin = f" ({first.origin})" if first.origin else ""
    reason = (
        f"{absent} without calling {first.op} #{first.seq} on {first.group}{origin}, "
        f"which {waiting} {'waits' if len(waiters) == 1 else 'wait'}{where}"
    )
    if first.origin.startswith("DDP gradient bucket"):
        reason += f"\nhint: {DDP_HINT}"
    return reason


def outside_reason(waiters: Sequence[Beacon], targets: Sequence[int], noun: str) -> str:
    """The sentence for ranks waiting for peers that do not run this cell (`--ranks`)."""
    first = waiters[0]
    missing = sorted({r for b in waiters for r in b.waiting_for if r not in targets})
    where = f" at {first.site}" if first.site is not None else ""
    waiting = format_ranks(w.rank for w in waiters)
    return (
        f"{format_ranks(missing)} {'does' if len(missing) == 1 else 'do'} not run {noun} (it "
        f"runs on {format_ranks(sorted(targets))} only), so {first.op} #{first.seq} on "
        f"{first.group}, which {waiting} {'waits' if len(waiters) == 1 else 'wait'}{where}, "
        "cannot complete: run collectives on every rank of their group (drop --ranks)"
    )


def skipped_call(
    events: Sequence[CollectiveEvent],
    waiting: Sequence[Beacon] = (),
    order: Mapping[int, int] | None = None,
) -> str:
    """Where ranks' collectives stopped lining up: the first (group, seq) whose call sites
    differ. A rank whose call there comes from the line another rank reaches next skipped the
    call before it; otherwise the sites are only listed. Read after a desync, from every rank's
    recorded events of the run and the beacons of the ranks that were left waiting. Where
    several ranks fit, the first in `order` (rank -> its place; default: by rank) is named.

    One pass over the calls at that (group, seq), at any number of ranks: for each line, the
    first rank (in order) that reaches it next from another line."""
    at: dict[tuple[str, int], dict[int, tuple[str, str]]] = defaultdict(dict)
    for e in events:
        at[(e.group, e.seq)][e.rank] = (e.op, str(e.site))
    for w in waiting:
        at[(w.group, w.seq)][w.rank] = (w.op, str(w.site))
    places = order or {}

    def place(rank: int) -> tuple[int, int]:
        return places.get(rank, len(places)), rank

    for group, seq in sorted(at, key=lambda k: k[1]):
        calls = at[(group, seq)]
        if len({site for _, site in calls.values()}) < 2:
            continue
        later = at.get((group, seq + 1), {})
        ranked = sorted(calls.items(), key=lambda kv: place(kv[0]))
        reached: dict[str, tuple[int, str, str]] = {}  # a line -> who reaches it next, from where
        for q, (op, other) in ranked:
            next_site = later.get(q, ("", ""))[1]
            if next_site != other and next_site not in reached:
                reached[next_site] = (q, op, other)
        for rank, (_, site) in ranked:
            if site in reached:
                q, op, other = reached[site]
                return (
                    f"rank {rank} skipped {op} #{seq} at {other} (rank {q} called it); "
                    f"rank {rank}'s #{seq} was its call at {site}"
                )
        at_sites = [(r, site) for r, (_, site) in ranked]
        if len(at_sites) >= GROUP_FROM:  # ranks at one site: one part
            sites = ", ".join(f"{format_ranks(rs)} at {s}" for rs, s in same_ranks(at_sites))
        else:
            sites = ", ".join(f"rank {r} at {site}" for r, site in at_sites)
        return f"the ranks' collectives stop lining up at #{seq} on {group}: {sites}"
    return ""


def done_words(state: RankState, error: str, noun: str) -> str:
    """`finished the cell`, `raised ValueError: ...`, `quit the debugger at cell In[3] line 2`."""
    quit_words = re.match(r"DebuggerQuit: rank \d+ (quit the debugger.*)", error)
    if quit_words is not None:
        return quit_words.group(1)
    return DONE_WORDS[state].format(error=error, noun=noun)
