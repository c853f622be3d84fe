"""How ranks hand each other fingerprints: boards of stamped slots, and the wait for them.

A **board** has `rings` writers, each owning a ring of `depth` slots. A writer posts a payload
with a **stamp** (seq + 1, so 0 means empty) into slot `stamp % depth`; a reader asking ring r for
stamp s gets the payload, `None` (the slot still holds an older stamp: not posted yet) or
`LAPPED` (a newer one: the writer has gone a whole ring further and the payload is gone).

- Collectives use a board per group, one ring per member, depth 2. A rank posts seq s only after
  it has read every peer's s - 1, so every peer has finished reading s - 2, the previous occupant
  of the slot: no acknowledgements are needed and the board never grows.
- Point-to-point messages use a board per channel (group, source, destination, tag): ring 0
  carries the sender's fingerprints, depth `P2P_DEPTH`; ring 1 the receiver's verdicts on
  mismatches. Senders never wait; a receiver that falls a whole ring behind gets `LAPPED` and
  lets that message through unchecked.

Two kinds of board, chosen per group:

- `ShmBoard` (`shm`): an mmap'ed file in /dev/shm, for groups whose ranks share a host. A post
  is a few hundred nanoseconds.
- `StoreBoard` (`store`): keys in the control plane's `torch.distributed.Store`: the path across
  hosts, one store round trip per post and per poll.

A group whose ranks span hosts, several on some, exchanges in two levels (`tiered.Tiers`):
shared memory on each host, one leader per host through the store (from `tiered.SPREAD_HOSTS`
hosts on, the leaders agree by dissemination, in log2 H rounds).

`collect()` (`wait`) waits for a set of rings: on a `ShmBoard` it sleeps on the ring's doorbell
and polls only in a window around the time it expects the post; on a `StoreBoard` it polls with
growing sleeps. Every `TICK_NS` it calls `tick` (beacon, the kernel's abort key), so Ctrl-C and
the abort key stop a wait within milliseconds. What every board is, and what the two kinds
share, is in `board`.

Measured here (2 cores): a post plus a peer's read is ~1 us; a two-process ping-pong through a
ShmBoard takes ~7 us per round trip (median, busy machine); a store round trip ~60-100 us.
"""

from __future__ import annotations

from distnb.rank.checked.exchange.board import (
    LAPPED,
    MAX_SLEEP_S,
    MIN_SLEEP_S,
    P2P_DEPTH,
    Board,
    backoff_s,
)
from distnb.rank.checked.exchange.shm import SHM_DIR, SPIN_NS, ShmBoard, cleanup, shm_path
from distnb.rank.checked.exchange.store import StoreBoard
from distnb.rank.checked.exchange.tiered import AGREED, Missing, Tiers, hosts_of, rounds
from distnb.rank.checked.exchange.wait import TICK_NS, Tick, collect, poll_once

__all__ = [
    "AGREED",
    "LAPPED",
    "MAX_SLEEP_S",
    "MIN_SLEEP_S",
    "P2P_DEPTH",
    "SHM_DIR",
    "SPIN_NS",
    "TICK_NS",
    "Board",
    "Missing",
    "ShmBoard",
    "StoreBoard",
    "Tick",
    "Tiers",
    "backoff_s",
    "cleanup",
    "collect",
    "hosts_of",
    "poll_once",
    "rounds",
    "shm_path",
]
