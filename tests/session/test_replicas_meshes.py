"""Replica checks on 4 real ranks: FSDP2, HSDP on a 2x2 mesh, tensor parallel with data parallel,
and hand-averaged gradients. Valid programs agree; a drift is named within its replica group and
never across legitimate shards."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import distnb
from distnb.session import Session

pytestmark = pytest.mark.cluster

MESH = """\
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
"""

# the same model and batch on every rank; each step's loss is summed over what the rank holds
TRAIN = """\
for _ in range(2):
    opt.zero_grad()
    model(torch.ones(4, 8) * (batch_of + 1)).sum().backward()
    opt.step()
"""


@pytest.fixture(scope="module")
def four() -> Iterator[Session]:
    with distnb.start(4, progress=False) as s:
        s.run(MESH)
        yield s


def _model(seed: int = 0) -> str:
    return (
        f"torch.manual_seed({seed})\n"
        "model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))\n"
    )


def test_fsdp2_fully_sharded_has_nothing_to_compare(four: Session) -> None:
    four.run(
        _model()
        + "mesh = init_device_mesh('cpu', (4,))\n"
        + "fully_shard(model, mesh=mesh)\n"
        + "opt = torch.optim.Adam(model.parameters(), lr=0.1)\nbatch_of = rank\n"
        + TRAIN
    )
    view = four.diff("model", grads=True)
    assert view.agree and view.report.compared == 0
    assert str(view).startswith("nothing to compare on ranks 0-3: every tensor is sharded")


def test_hsdp_compares_across_the_replicate_dimension_only(four: Session) -> None:
    four.run(
        _model()
        + "mesh = init_device_mesh('cpu', (2, 2), mesh_dim_names=('replicate', 'shard'))\n"
        + "fully_shard(model, mesh=mesh)\n"
        + "opt = torch.optim.Adam(model.parameters(), lr=0.1)\nbatch_of = rank\n"
        + TRAIN
    )
    view = four.diff("model", "opt", grads=True)
    # 4 parameters, their grads, Adam's exp_avg and exp_avg_sq: shards compared in 2 groups each
    assert view.agree, str(view)
    assert view.report.compared >= 2 * 4 * 4 and view.report.alone == 0
    four.run(
        "with torch.no_grad():\n    if rank == 3:\n        model[2].weight.to_local()[0, 1] += 0.5"
    )
    (d,) = four.diff("model").report.differences
    # rank 3 holds the second shard of replica 1: its replica is rank 1, never rank 2 (shard 0)
    assert d.name == "model.2.weight" and d.agree == ((1,), (3,))
    assert d.max_abs == pytest.approx(0.5) and d.index == (0, 1)


def test_tensor_parallel_shards_compare_across_data_parallel(four: Session) -> None:
    four.run(
        "from torch.distributed.tensor.parallel import (\n"
        "    ColwiseParallel, RowwiseParallel, parallelize_module)\n"
        + _model()
        + "mesh = init_device_mesh('cpu', (2, 2), mesh_dim_names=('dp', 'tp'))\n"
        + "plan = {'0': ColwiseParallel(), '2': RowwiseParallel()}\n"
        + "parallelize_module(model, mesh['tp'], plan)\n"
        + "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "batch_of = 0  # replicas see the same batch, as hand-made data parallel would\n"
        + TRAIN
    )
    view = four.diff("model", "opt")
    assert view.agree and view.report.alone == 0, str(view)
    four.run(
        "with torch.no_grad():\n    if rank == 2:\n        model[0].weight.to_local()[1, 0] -= 1"
    )
    (d,) = four.diff("model").report.differences
    # mesh [[0, 1], [2, 3]]: rank 2 holds TP shard 0 of DP replica 1; its replica is rank 0
    assert d.name == "model.0.weight" and d.agree == ((0,), (2,))
    assert d.max_abs == pytest.approx(1.0)


def test_hand_averaged_gradients_agree_and_a_per_rank_init_is_found(four: Session) -> None:
    average = (
        "def step():\n"
        "    opt.zero_grad()\n"
        "    model(torch.randn(4, 8)).sum().backward()\n"
        "    for p in model.parameters():\n"
        "        dist.all_reduce(p.grad)\n"
        "        p.grad /= world_size\n"
        "    opt.step()\n"
        "torch.manual_seed(100 + rank)  # each rank's own batches\n"
        "for _ in range(3):\n"
        "    step()\n"
    )
    four.run(_model(seed=0) + "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n" + average)
    assert four.diff("model", grads=True).agree
    # the model seeded by rank where it should not be: no DDP broadcast puts it right
    four.run(_model(seed=7) + "torch.manual_seed(rank)\nmodel[2].reset_parameters()\n")
    four.run("opt = torch.optim.SGD(model.parameters(), lr=0.1)\n" + average)
    found = {d.name: d.agree for d in four.diff("model").report.differences}
    assert found == {n: ((0,), (1,), (2,), (3,)) for n in ("model.2.weight", "model.2.bias")}
