from __future__ import annotations

import pytest

from distnb.errors import ConfigError
from distnb.records.cell import EngineProbe
from distnb.session.joining import assign_ranks, choose_backend


def probe(eid: int, host: str, gpus: int = 0, mpi: int | None = None) -> EngineProbe:
    return EngineProbe(engine_id=eid, host=host, pid=100 + eid, cuda_devices=gpus, mpi_rank=mpi)


def test_ranks_are_grouped_by_host_not_engine_id() -> None:
    placed = assign_ranks([probe(0, "a"), probe(1, "b"), probe(2, "a"), probe(3, "b")])
    assert [(p.rank, p.probe.engine_id, p.local_rank) for p in placed] == [
        (0, 0, 0),
        (1, 2, 1),
        (2, 1, 0),
        (3, 3, 1),
    ]
    assert {p.local_world_size for p in placed} == {2}


def test_mpi_order_wins_when_every_engine_has_one() -> None:
    placed = assign_ranks([probe(0, "a", mpi=1), probe(1, "a", mpi=0)])
    assert [p.probe.engine_id for p in placed] == [1, 0]


def test_a_launcher_rank_every_engine_shares_is_not_an_order() -> None:
    """Local engines of a kernel that srun started inherit its SLURM_PROCID, 0 for all."""
    placed = assign_ranks([probe(0, "b", mpi=0), probe(1, "a", mpi=0), probe(2, "b", mpi=0)])
    assert [p.probe.engine_id for p in placed] == [0, 2, 1]  # grouped by host instead


def test_auto_backend_is_nccl_only_with_a_gpu_per_rank() -> None:
    assert choose_backend("auto", assign_ranks([probe(0, "a", 2), probe(1, "a", 2)])) == "nccl"
    assert choose_backend("auto", assign_ranks([probe(0, "a", 1), probe(1, "a", 1)])) == "gloo"
    assert choose_backend("gloo", assign_ranks([probe(0, "a", 2)])) == "gloo"


def test_nccl_with_too_few_gpus_says_what_to_do() -> None:
    with pytest.raises(ConfigError, match=r"has 1 CUDA device\(s\). Use -n 1 or --backend gloo"):
        choose_backend("nccl", assign_ranks([probe(0, "a", 1), probe(1, "a", 1)]))
