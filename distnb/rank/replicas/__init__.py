"""Replica checks on a rank: the tensors named, their replica groups and digests of their bits.

- `entries`: every tensor and value under the names asked about, with its replica group (who
  should hold the same bytes: a DDP model's process group, a DTensor's `Replicate` dimensions);
- `digest`: a 64-bit digest of each tensor's bytes, made on its device, read in one go;
- `check`: one replica check, the ranks together (`diff_replicas`);
- `watch`: the digests of a module's parameters every N-th step, to find the first that differed.
"""

from __future__ import annotations

from distnb.rank.replicas.digest import digests, digests_of
from distnb.rank.replicas.entries import Entry, entries_of, replica_group

__all__ = ["Entry", "digests", "digests_of", "entries_of", "replica_group"]
