"""Code as users write it, on real 2-rank gloo cells: DDP, FSDP2, DTensor, functional
collectives and torch.compile, none of it calling a distnb helper.

Every valid program gives the values an unchecked run gives; every bug is named (error type,
ranks, op, origin, line) within seconds rather than at the cell's timeout, and the next cell
runs on the same process group. 4-rank circular waits across sub-groups are at the end.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

import pytest

import distnb
from distnb.errors import CollectiveDesyncError, CollectiveMismatchError, RankError
from distnb.records.collective import MatchKind
from harness.processes import NAMED_S

if TYPE_CHECKING:
    from distnb.session import Session

pytestmark = pytest.mark.cluster

DDP_SETUP = """
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(0)
"""

MESH_SETUP = """
import torch.nn as nn
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
mesh = init_device_mesh("cpu", (2,))
"""

FSDP_SETUP = """
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
for layer in (model[0], model[2]):
    fully_shard(layer)
fully_shard(model)
"""


def still_works(session: Session) -> None:
    result = session.run("y = torch.ones(2)\ndist.all_reduce(y)\ny.sum().item()", timeout=30)
    assert result.result(0) == result.result(1) == "4.0"


def fails(
    session: Session,
    code: str,
    error: type[RankError],
    within: float = NAMED_S,
    timeout: float = 60,
) -> RankError:
    """Run a buggy cell: it must raise `error` well before its timeout."""
    started = time.monotonic()
    with pytest.raises(error) as info:
        session.run(code, timeout=timeout)
    assert time.monotonic() - started < within
    return info.value


def same_as_unchecked(session: Session, code: str, value: str) -> None:
    """The cell's last value on each rank, checked and unchecked alike."""
    checked = session.run(code, timeout=120)
    plain = session.run(code, timeout=120, check=False)
    for rank in (0, 1):
        assert checked.result(rank) == plain.result(rank) is not None
    assert eval(value, {"result": checked.result})


# --- DDP: nothing to register, every collective of the constructor and the reducer is checked


def test_ddp_training_matches_unchecked(session: Session) -> None:
    session.run(DDP_SETUP)
    code = (
        "torch.manual_seed(0)\n"
        "ddp = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))\n"
        "opt = torch.optim.SGD(ddp.parameters(), lr=0.1)\n"
        "torch.manual_seed(rank)\n"
        "for _ in range(3):\n"
        "    opt.zero_grad()\n"
        "    ddp(torch.randn(8, 16)).square().mean().backward()\n"
        "    opt.step()\n"
        "round(sum(p.sum().item() for p in ddp.parameters()), 5)"
    )
    same_as_unchecked(session, code, "result(0) == result(1)")


def test_ddp_models_that_differ_are_named_by_parameter(session: Session) -> None:
    session.run(DDP_SETUP)
    err = fails(
        session,
        "hidden = 48 if rank == 0 else 32\n"
        "model = nn.Sequential(nn.Linear(16, hidden), nn.ReLU(), nn.Linear(hidden, 2))\n"
        "ddp = DDP(model)\n",
        CollectiveMismatchError,
    )
    assert isinstance(err, CollectiveMismatchError) and err.mismatch is not None
    assert err.mismatch.kind is MatchKind.MODEL
    assert "DDP constructor: parameter shapes" in err.message
    assert "parameter '0.weight' is float32[48, 16] on rank 0 and float32[32, 16] on rank 1" in (
        err.message
    )
    assert "cell In[" in err.message and "line 3: ddp = DDP(model)" in err.message
    still_works(session)


@pytest.mark.parametrize(
    ("code", "line"),
    [
        (  # one rank skips a step
            "ddp = DDP(nn.Linear(8, 2))\n"
            "for step in range(3):\n"
            "    if rank == 1 and step == 1:\n"
            "        continue\n"
            "    ddp(torch.ones(4, 8)).sum().backward()\n",
            5,
        ),
        (  # one rank runs an extra backward
            "ddp = DDP(nn.Linear(8, 2))\n"
            "for step in range(3 if rank == 0 else 2):\n"
            "    ddp(torch.ones(4, 8)).sum().backward()\n",
            3,
        ),
        (  # a parameter unused on one rank
            "class Net(nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            "        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 2)\n"
            "    def forward(self, x):\n"
            "        return self.b(self.a(x)) if rank == 0 else self.a(x)[:, :2]\n"
            "ddp = DDP(Net())\n"
            "ddp(torch.ones(4, 8)).sum().backward()\n",
            8,
        ),
    ],
    ids=["skipped-step", "extra-backward", "unused-parameter"],
)
def test_ddp_desyncs_name_the_bucket_and_the_line(session: Session, code: str, line: int) -> None:
    session.run(DDP_SETUP)
    err = fails(session, code, CollectiveDesyncError)
    assert err.message.startswith("rank 1 finished the cell without calling all_reduce #")
    assert "(DDP gradient bucket 0 (" in err.message
    assert "which rank 0 waits at cell In[" in err.message and f"line {line}" in err.message
    assert "find_unused_parameters=True" in err.message  # the hint
    still_works(session)


# --- functional collectives, DTensor, torch.compile -----------------------------------------


def test_dtensor_and_functional_collectives_match_unchecked(session: Session) -> None:
    session.run(MESH_SETUP)
    code = (
        "a = distribute_tensor(torch.arange(16.).reshape(4, 4), mesh, [Shard(0)])\n"
        "b = distribute_tensor(torch.ones(4, 4), mesh, [Shard(1)])\n"
        "c = (a @ b).full_tensor() + funcol.all_reduce(torch.ones(4) * rank, 'sum', mesh)\n"
        "c.sum().item()"
    )
    same_as_unchecked(session, code, "result(0) == result(1) == '496.0'")  # (a @ b).sum() + 16


def test_functional_collective_shape_mismatch_is_named(session: Session) -> None:
    session.run(MESH_SETUP)
    err = fails(
        session,
        "y = funcol.all_reduce(torch.ones(4 if rank == 0 else 3), 'sum', mesh)\n",
        CollectiveMismatchError,
    )
    assert err.message.startswith("shape mismatch in all_reduce #")
    assert "rank 0: [4], rank 1: [3]" in err.message
    still_works(session)


def test_dtensor_from_local_with_uneven_shards_is_named(session: Session) -> None:
    session.run(MESH_SETUP)
    err = fails(
        session,
        "dt = DTensor.from_local(torch.ones(2 if rank == 0 else 3, 4), mesh, [Shard(0)])\n"
        "full = dt.full_tensor()\n",
        CollectiveMismatchError,
    )
    assert "shape mismatch in all_gather_single" in err.message
    assert "(DTensor redistribute S(0) -> R)" in err.message
    assert "line 2: full = dt.full_tensor()" in err.message
    still_works(session)


@pytest.mark.parametrize(
    "body",
    ["dist.all_reduce(x)\n    return x * 2", "return funcol.all_reduce(x * 2, 'sum', mesh) + 1"],
    ids=["dist", "functional"],
)
def test_compiled_collective_mismatch_is_named(session: Session, body: str) -> None:
    session.run(MESH_SETUP)
    err = fails(
        session,
        # shapes no other test compiles this graph for: inductor's cache would serve another
        # function's graph, with that function's lines (distnb names the calling line then)
        f"@torch.compile\ndef f(x):\n    {body}\nf(torch.ones(6 if rank == 0 else 7))\n",
        CollectiveMismatchError,
        # it compiles first: ~20 s with torch 2.8's and 2.9's CUDA builds on an idle machine,
        # minutes on a busy one; named, all the same, well before the cell's timeout
        within=240,
        timeout=300,
    )
    assert err.message.startswith("shape mismatch in all_reduce #")
    assert "rank 0: [6], rank 1: [7]" in err.message
    # the graph runs generated code: the site is the line its node was traced from, and the
    # origin names the line that called the compiled function
    call_line = 3 + body.count("\n") + 1
    origin = rf"\(compiled graph, called at cell In\[\d+\] line {call_line}\): "
    assert re.search(origin, err.message), err.message
    first = body.split("\n")[0]
    assert err.message.count(f" line 3: {first}") == 2, err.message
    assert "eval_with_key" not in err.message and "torchinductor" not in err.message
    still_works(session)


def test_a_skipped_functional_collective_is_named_at_the_next_call(session: Session) -> None:
    session.run(MESH_SETUP)
    err = fails(
        session,
        "x = torch.ones(4)\n"
        "if rank == 0:\n"
        "    funcol.all_reduce(x, 'sum', mesh).wait()\n"
        "dist.all_reduce(x)\n",
        CollectiveDesyncError,
    )
    assert "rank 1 skipped all_reduce #" in err.message and "line 3" in err.message
    still_works(session)


# --- FSDP2 -----------------------------------------------------------------------------------


def test_fsdp2_training_matches_unchecked(session: Session) -> None:
    session.run(FSDP_SETUP)
    code = (
        "model.zero_grad(set_to_none=True)\n"
        "for _ in range(2):\n"
        "    model(torch.ones(4, 8) * (rank + 1)).sum().backward()\n"
        "round(sum(p.grad.full_tensor().sum().item() for p in model.parameters()), 4)"
    )
    same_as_unchecked(session, code, "result(0) == result(1)")


def test_fsdp2_rank_skipping_a_forward_is_named_with_both_origins(session: Session) -> None:
    session.run(FSDP_SETUP)
    err = fails(
        session,
        "for step in range(2):\n"
        "    if rank == 1 and step == 1:\n"
        "        break\n"
        "    model(torch.ones(4, 8)).sum().backward()\n"
        "w = model[0].weight.full_tensor()\n",
        CollectiveMismatchError,
    )
    assert "[FSDP2 all-gather for '0']" in err.message
    assert "[DTensor redistribute S(0) -> R]" in err.message
    still_works(session)


# --- circular waits across sub-groups, 4 ranks -------------------------------------------------


def test_a_circular_wait_of_four_ranks_is_named_on_every_rank() -> None:
    with distnb.start(4, progress=False) as s:
        s.run("g = {k: dist.new_group(list(k)) for k in [(0, 3), (0, 1), (1, 2), (2, 3)]}")
        started = time.monotonic()
        with pytest.raises(CollectiveDesyncError) as info:
            s.run(
                "peer = {0: (0, 3), 1: (0, 1), 2: (1, 2), 3: (2, 3)}[rank]\n"
                "dist.all_reduce(torch.ones(2), group=g[peer])\n",
                timeout=60,
            )
        assert time.monotonic() - started < NAMED_S  # named, not the cell's timeout
        err = info.value
        assert sorted(f.rank for f in err.failures) == [0, 1, 2, 3]
        assert err.message.startswith("deadlock: 4 ranks wait for each other in a circle")
        for rank, group in (
            (0, "group[0,3]"),
            (1, "group[0,1]"),
            (2, "group[1,2]"),
            (3, "group[2,3]"),
        ):
            assert f"rank {rank} waits in all_reduce #0 on {group} at cell" in err.message
        result = s.run("y = torch.ones(2)\ndist.all_reduce(y)\ny.sum().item()")
        assert result.result(3) == "8.0"


def test_a_rank_error_inside_ddp_shows_no_distnb_frames(session: Session) -> None:
    session.run(DDP_SETUP + "ddp = DDP(nn.Linear(8, 2))\n")
    with pytest.raises(RankError) as info:
        session.run("ddp(torch.ones(4, 8 if rank == 0 else 6)).sum().backward()", timeout=60)
    (failure,) = [f for f in info.value.failures if f.rank == 1]
    assert failure.ename == "RuntimeError" and "mat1 and mat2" in failure.evalue
    assert "ddp(torch.ones" in failure.traceback
    assert "distnb" not in failure.traceback  # distnb's wrappers hide their frames
    still_works(session)


# --- inference mode: ops' kernels are not reached there; Python callers are checked anyway ----


def test_an_eval_loop_under_inference_mode_is_checked(session: Session) -> None:
    err = fails(
        session,
        "@torch.inference_mode()\n"
        "def evaluate(batches):\n"
        "    total = torch.zeros(1)\n"
        "    for _ in range(batches):\n"
        "        total += 1\n"
        "        dist.all_reduce(total)\n"
        "    return total\n"
        "evaluate(3 if rank == 0 else 2)\n",  # uneven eval shards: rank 1 has fewer batches
        CollectiveDesyncError,
    )
    assert err.message.startswith("rank 1 finished the cell without calling all_reduce #")
    assert "line 6" in err.message
    mismatch = fails(
        session,
        "with torch.inference_mode():\n    dist.all_reduce(torch.ones(2 + rank))\n",
        CollectiveMismatchError,
    )
    assert "rank 0: [2], rank 1: [3]" in mismatch.message
    result = session.run(
        "with torch.inference_mode():\n"
        "    t = torch.ones(2) * (rank + 1)\n"
        "    dist.all_reduce(t)\n"
        "(t.tolist(), t.is_inference())"
    )
    assert result.result(0) == result.result(1) == "([3.0, 3.0], True)"
