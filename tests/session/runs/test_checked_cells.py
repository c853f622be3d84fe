"""The checked-collective runtime seen from the notebook, on a real 2-rank gloo cluster.

Every error names both ranks' calls and cell lines, and the next cell still runs on the same
process group. The per-op rules themselves are unit-tested in tests/test_matching.py and on raw
gloo ranks in tests/rank/test_checked.py.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

import distnb
from distnb.errors import (
    CollectiveDesyncError,
    CollectiveMismatchError,
    RankDiedError,
    RankTimeoutError,
)
from distnb.records.collective import MatchKind
from harness.processes import NAMED_S

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from distnb.session import Session


pytestmark = pytest.mark.cluster

ACCELERATE_EXAMPLE = (
    "x = torch.zeros(1, 5) if rank == 0 else torch.zeros(1, 2, 5)\n"  # Accelerate's docs
    "dist.broadcast(x, src=0)\n"
)


def still_works(session: Session) -> None:
    result = session.run("y = torch.ones(2)\ndist.all_reduce(y)\ny.sum().item()")
    assert result.result(0) == "4.0" and result.result(1) == "4.0"


@pytest.mark.parametrize(
    ("code", "kind", "calls"),
    [
        (ACCELERATE_EXAMPLE, MatchKind.SHAPE, ["float32[1, 5]", "float32[1, 2, 5]"]),
        (
            "x = torch.ones(4, dtype=torch.float32 if rank == 0 else torch.float16)\n"
            "dist.all_reduce(x)\n",
            MatchKind.DTYPE,
            ["float32[4]", "float16[4]"],
        ),
        (
            "x = torch.ones(4)\n"
            "dist.all_reduce(x, op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX)\n",
            MatchKind.REDUCE_OP,
            ["SUM", "MAX"],
        ),
        (
            "x = torch.ones(4)\ndist.broadcast(x, src=rank)\n",
            MatchKind.ROOT,
            ["src=0", "src=1"],
        ),
        (
            "x = torch.ones(4)\n"
            "if rank == 0:\n    dist.all_reduce(x)\nelse:\n    dist.broadcast(x, src=0)\n",
            MatchKind.COLLECTIVE_TYPE,
            ["all_reduce", "broadcast"],
        ),
        (
            "x = torch.ones(4, device='cpu' if rank == 0 else 'meta')\ndist.all_reduce(x)\n",
            MatchKind.DEVICE,
            ["all_reduce(float32[4]", "meta"],
        ),
        (
            "out = torch.empty(4)\n"
            "dist.all_to_all_single(out, torch.ones(4), [2, 2], [1, 3] if rank else [2, 2])\n",
            MatchKind.SPLIT_SIZES,
            ["[2, 2]", "[1, 3]"],
        ),
        (
            "objs = [1, 2] if rank == 0 else [1, 2, 3]\ndist.broadcast_object_list(objs, src=0)\n",
            MatchKind.COUNT,
            ["2", "3"],
        ),
        (
            "sub = dist.new_group([0, 1])\n"
            "dist.all_reduce(torch.ones(2), group=sub if rank == 0 else None)\n",
            MatchKind.GROUP,
            ["all_reduce(float32[2], op=SUM)", "all_reduce(float32[2], op=SUM)"],
        ),
    ],
    ids=["shape", "dtype", "reduce-op", "root", "op-type", "device", "splits", "count", "group"],
)
@pytest.mark.check
def test_mismatch_names_each_rank_call_and_line(
    session: Session, code: str, kind: MatchKind, calls: list[str]
) -> None:
    started = time.monotonic()
    with pytest.raises(CollectiveMismatchError) as info:
        session.run(code)
    assert time.monotonic() - started < NAMED_S
    err = info.value
    assert err.mismatch is not None and err.mismatch.kind is kind
    assert [f.rank for f in err.failures] == [0, 1]  # every rank raised, nothing was sent
    lines = err.message.splitlines()
    rank0 = next(line for line in lines if line.strip().startswith("rank 0:"))
    rank1 = next(line for line in lines if line.strip().startswith("rank 1:"))
    assert calls[0] in rank0 and calls[1] in rank1
    assert "line " in rank0 and "line " in rank1
    text = "\n".join(err._render_traceback_())
    assert "Traceback" not in text  # the message says it all; tracebacks stay on err.failures
    still_works(session)


@pytest.mark.check
def test_mismatch_in_the_notebook_says_the_cell_and_line(shell: InteractiveShell) -> None:
    with pytest.raises(CollectiveMismatchError) as info:
        shell.run_cell_magic("allranks", "", ACCELERATE_EXAMPLE)
    assert "line 3: dist.broadcast(x, src=0)" in info.value.message  # line 1 is the magic


def test_valid_programs_raise_nothing(session: Session, capsys: pytest.CaptureFixture[str]) -> None:
    session.run(
        "sizes = [1, 3] if rank == 0 else [2, 2]\n"  # uneven all_to_all_single, agreeing splits
        "recv = [1, 2] if rank == 0 else [3, 2]\n"
        "out = torch.empty(sum(recv))\n"
        "dist.all_to_all_single(out, torch.arange(4.) + 10 * rank, recv, sizes)\n"
        "g = [torch.empty(2) for _ in range(2)]\n"
        "dist.all_gather(g, torch.full((2,), float(rank)))\n"
        "objs = [None, None]\n"
        "dist.all_gather_object(objs, {'rank': rank})\n"
        "t = torch.full((2,), float(rank))\n"
        "if rank == 0:\n    dist.send(t, 1)\nelse:\n    dist.recv(t, 0)\n"
        "w = dist.all_reduce(torch.ones(2), async_op=True)\nw.wait()\n"
        "print(out.tolist(), [x.tolist() for x in g], objs, t.tolist())"
    )
    lines = capsys.readouterr().out.splitlines()
    # all_gather and all_gather_object give every rank both ranks' values, in rank order; the
    # all_to_all_single halves go where the split sizes say; rank 1 received rank 0's zeros
    gathered = "[[0.0, 0.0], [1.0, 1.0]] [{'rank': 0}, {'rank': 1}] [0.0, 0.0]"
    assert f"[rank 0] [0.0, 10.0, 11.0] {gathered}" in lines
    assert f"[rank 1] [1.0, 2.0, 3.0, 12.0, 13.0] {gathered}" in lines


def test_ddp_training_step_with_checked_buckets(
    session: Session, capsys: pytest.CaptureFixture[str]
) -> None:
    session.run(
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "torch.manual_seed(0)\n"
        "ddp = DDP(torch.nn.Linear(4, 2))\n"
        "opt = torch.optim.SGD(ddp.parameters(), lr=0.1)\n"
        "for _ in range(3):\n"
        "    opt.zero_grad()\n"
        "    ddp(torch.ones(3, 4) * (rank + 1)).sum().backward()\n"
        "    opt.step()\n"
        "w = ddp.module.weight.detach().clone()\n"
        "ws = [torch.empty_like(w) for _ in range(world_size)]\n"
        "dist.all_gather(ws, w)\n"
        "print('same weights', torch.equal(ws[0], ws[1]))"
    )
    assert "[ranks 0-1] same weights True" in capsys.readouterr().out


def test_a_rank_that_leaves_the_loop_early_releases_the_others(session: Session) -> None:
    # The early-stopping bug: one rank decides alone to stop training.
    code = (
        "for step in range(5):\n"
        "    loss = torch.tensor([1.0])\n"
        "    if rank == 1 and step == 2:\n"
        "        break\n"
        "    dist.all_reduce(loss)\n"
    )
    started = time.monotonic()
    with pytest.raises(CollectiveDesyncError) as info:
        session.run(code, timeout=60)
    assert time.monotonic() - started < NAMED_S  # named, not the cell's timeout
    message = info.value.message
    assert "rank 1 finished the cell without calling all_reduce #" in message
    assert "line 5" in message
    still_works(session)


def test_a_rank_that_raises_releases_the_others(session: Session) -> None:
    code = (
        "x = torch.ones(2)\n"
        "if rank == 0:\n"
        "    raise RuntimeError('data loader broke')\n"
        "dist.all_reduce(x)\n"
    )
    with pytest.raises(Exception) as info:
        session.run(code, timeout=30)
    names = {f.ename for f in info.value.failures}
    assert names == {"RuntimeError", "CollectiveDesyncError"}
    desync = next(f for f in info.value.failures if f.ename == "CollectiveDesyncError")
    assert "rank 0 raised RuntimeError: data loader broke" in desync.evalue
    still_works(session)


@pytest.mark.check
def test_a_skipped_collective_is_reported_as_a_skip(session: Session) -> None:
    code = (
        "x = torch.ones(2)\n"
        "if rank == 0:\n"
        "    dist.all_reduce(x)\n"  # rank 1 skips this one
        "dist.all_reduce(x)\n"
    )
    with pytest.raises(CollectiveDesyncError) as info:
        session.run(code, timeout=30)
    message = info.value.message
    assert "rank 1 finished the cell" in message
    assert "rank 1 skipped all_reduce #" in message
    assert "line 3 (rank 0 called it); rank 1's #" in message and "line 4" in message
    still_works(session)


def test_a_rank_that_dies_is_named_and_restart_recovers() -> None:
    with distnb.start(2, progress=False) as s:
        with pytest.raises(RankDiedError) as info:
            s.run(
                "import os\nx = torch.ones(2)\nif rank == 1:\n    os._exit(7)\ndist.all_reduce(x)"
            )
        assert "rank 1" in str(info.value) and "exited with code 7" in str(info.value)
        s.restart()
        still_works(s)


def test_unchecked_switches(session: Session, capsys: pytest.CaptureFixture[str]) -> None:
    session.run(
        "import distnb\nx = torch.ones(2)\n"
        "with distnb.unchecked():\n    dist.all_reduce(x)\nprint(x.tolist())"
    )
    session.run("dist.all_reduce(x)\nprint(x.tolist())", check=False)
    out = capsys.readouterr().out
    assert "[ranks 0-1] [2.0, 2.0]" in out and "[ranks 0-1] [4.0, 4.0]" in out
    assert session.timeline(cells=1).timeline.collectives == ()


def test_hang_report_names_the_collective_each_waiting_rank_is_at(session: Session) -> None:
    code = "import time\nx = torch.ones(2)\nif rank == 1:\n    time.sleep(60)\ndist.all_reduce(x)\n"
    with pytest.raises(RankTimeoutError) as info:
        session.run(code, timeout=2)
    reports = {r.rank: r for r in info.value.reports}
    assert reports[0].detail.startswith("waiting at all_reduce #")
    assert "line 5) for rank 1" in reports[0].detail
    assert "line 4: time.sleep(60)" in reports[1].stack
    still_works(session)


def test_check_finite_names_the_rank_that_poisoned_the_reduction(session: Session) -> None:
    code = (
        "import distnb\n"
        "x = torch.tensor([float('nan') if rank == 1 else 1.0, 2.0])\n"
        "with distnb.check_finite():\n"
        "    dist.all_reduce(x)\n"
    )
    with pytest.raises(CollectiveMismatchError) as info:
        session.run(code)
    assert info.value.mismatch is not None
    assert info.value.mismatch.kind is MatchKind.NON_FINITE
    assert info.value.mismatch.ranks == (1,)
    still_works(session)
