"""What a rank runs with: its memory, its CUDA memory, torch's intra-op threads and its
distributed environment.

A rank answers `distnb.rank.resources.probe()` with one `RankResources`; `%dist_status` shows one
row per rank, and the environment variables grouped by value, so a rank whose `NCCL_*` or
`CUDA_VISIBLE_DEVICES` differs from its peers' stands out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from distnb.records.codec import Record

__all__ = ["CudaMemory", "RankResources", "env_groups"]


@dataclass(frozen=True, slots=True)
class CudaMemory(Record):
    """The caching allocator's view of the rank's CUDA device, in bytes."""

    device: str
    allocated: int
    reserved: int
    peak: int  # the most allocated at once since the rank started (or its peak was reset)
    total: int  # the device's memory


@dataclass(frozen=True, slots=True)
class RankResources(Record):
    """One rank's process: resident memory (now and its peak), torch's intra-op threads
    (`torch.get_num_threads()`: the threads one CPU op may use, not the process's thread count),
    CUDA memory and the environment variables that change how `torch.distributed` behaves
    (`env`, sorted)."""

    rank: int
    rss: int
    peak_rss: int
    intra_op_threads: int  # torch.get_num_threads()
    cuda: CudaMemory | None = None
    env: tuple[tuple[str, str], ...] = ()


def env_groups(resources: Sequence[RankResources]) -> list[tuple[str, list[tuple[str, list[int]]]]]:
    """Per variable, its values and the ranks that have each, in order of first appearance.

    A variable unset on some ranks lists them under the value `"(unset)"`.

    >>> env_groups([RankResources(0, 1, 1, 1, env=(("NCCL_DEBUG", "INFO"),)),
    ...             RankResources(1, 1, 1, 1)])
    [('NCCL_DEBUG', [('INFO', [0]), ('(unset)', [1])])]
    """
    names = sorted({name for r in resources for name, _ in r.env})
    groups = []
    for name in names:
        by_value: dict[str, list[int]] = {}
        for r in resources:
            by_value.setdefault(dict(r.env).get(name, "(unset)"), []).append(r.rank)
        groups.append((name, list(by_value.items())))
    return groups
