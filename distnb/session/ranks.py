"""Assigning ranks and choosing a backend: pure functions over what the engines said."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from distnb.errors import ConfigError
from distnb.records.cell import EngineProbe


@dataclass(frozen=True, slots=True)
class Placement:
    probe: EngineProbe
    rank: int
    local_rank: int
    local_world_size: int


def assign_ranks(probes: Sequence[EngineProbe]) -> list[Placement]:
    """Ranks 0..N-1: the launcher's order when every engine has a rank of its launcher (mpiexec,
    srun), each its own, else grouped by host.

    Grouping by host (hosts in order of their lowest engine id) makes `local_rank` the index
    of a rank on its host, which is the CUDA device it uses.
    """
    launched = {p.mpi_rank for p in probes}
    if None not in launched and len(launched) == len(probes):
        ordered = sorted(probes, key=lambda p: p.mpi_rank or 0)
    else:
        first_seen: dict[str, int] = {}
        for p in sorted(probes, key=lambda p: p.engine_id):
            first_seen.setdefault(p.host, len(first_seen))
        ordered = sorted(probes, key=lambda p: (first_seen[p.host], p.engine_id))
    per_host: dict[str, int] = {}
    counts = {p.host: sum(q.host == p.host for q in probes) for p in probes}
    placements = []
    for rank, p in enumerate(ordered):
        local = per_host.get(p.host, 0)
        per_host[p.host] = local + 1
        placements.append(Placement(p, rank, local, counts[p.host]))
    return placements


def choose_backend(requested: str, placements: Sequence[Placement]) -> str:
    """`auto` is NCCL when every rank has a CUDA device of its own, else gloo."""
    short = [p for p in placements if p.probe.cuda_devices < p.local_world_size]
    if requested == "gloo":
        return "gloo"
    if requested == "nccl":
        if short:
            p = short[0]
            raise ConfigError(
                f"--backend nccl needs one CUDA device per rank, but host {p.probe.host} runs "
                f"{p.local_world_size} ranks and has {p.probe.cuda_devices} CUDA device(s). "
                f"Use -n {p.probe.cuda_devices or 1} or --backend gloo."
            )
        return "nccl"
    return "gloo" if short or not placements else "nccl"
