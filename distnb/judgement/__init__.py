"""Judgement: do the ranks' calls fit, and where are the ranks? Pure functions over records.

One room for every verdict distnb gives, on its own ranks (cells, scripts) and on an attached
job alike; no processes, no torch, no store:

- `matching`: do the members' fingerprints at one (group, seq) fit (`match`, `match_p2p`,
  `deadlock`)? `rules`, `shapes` and `words` are its parts; `mismatch` builds the message,
  saying whether the calls were held by a check or went to the backend;
- `circles`: ranks that wait for each other in a circle (`find_cycle`, `cycle_reason`), and
  who holds a collective up (`held_up_by`);
- `desync`: peers that ended, or do not run the cell, without calling the collective others
  wait at (`desync_reason`, `outside_reason`); where the ranks' calls stopped lining up
  (`skipped_call`);
- `snapshot`: every verdict a snapshot of all ranks allows (an attached job's), each only
  once its evidence holds: a wait is judged against the ranks' own recent pace;
- `slowness`: who is slow and why, from profiled steps: each rank's time per step by phase, the
  straggler and the phase, module or op that makes it late (`breakdown`).
"""

from distnb.judgement.circles import cycle_reason, find_cycle, held_up_by
from distnb.judgement.desync import (
    DDP_HINT,
    desync_reason,
    done_words,
    outside_reason,
    skipped_call,
)
from distnb.judgement.matching import canonical_op, deadlock, describe, match, match_p2p

__all__ = [
    "DDP_HINT",
    "canonical_op",
    "cycle_reason",
    "deadlock",
    "describe",
    "desync_reason",
    "done_words",
    "find_cycle",
    "held_up_by",
    "match",
    "match_p2p",
    "outside_reason",
    "skipped_call",
]
