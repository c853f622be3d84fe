"""Two real gloo ranks: one goes non-finite, an all-reduce of gradients spreads it to the other."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from distnb.records.overflow import Phase, RankOverflowReport, summarize

WORLD = 2


def _inject_inf(module: nn.Module, args: object, output: torch.Tensor) -> torch.Tensor:
    out = output.clone()
    out[0, 0] = float("inf")
    return out


def _rank_main(rank: int, tmp: str) -> None:
    """One rank: two data-parallel SGD steps with gradients averaged by all_reduce."""
    import distnb.overflow as overflow

    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(tmp, "store"), WORLD)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD)
    try:
        torch.manual_seed(0)  # the same weights on both ranks
        model = nn.Sequential(
            nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)
        )
        injected = None
        if rank == 1:  # registered before the watch's hooks, so the watch sees its output
            injected = model[2].register_forward_hook(_inject_inf)
        w = overflow.watch(model)  # rank from the process group
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(rank))
        for _ in range(2):
            model(x).square().mean().backward()
            for p in model.parameters():
                assert p.grad is not None
                dist.all_reduce(p.grad)
                p.grad /= WORLD
            opt.step()
            opt.zero_grad()
            if injected is not None:
                injected.remove()  # rank 1 goes bad once; the all_reduce does the rest
                injected = None
        w.step()
        w.detach()
        Path(tmp, f"rank{rank}.json").write_text(json.dumps(w.report().to_dict()))
        dist.barrier()
    except BaseException:
        dist.destroy_process_group()
        raise
    # Both ranks are done: end without tearing gloo down. Its teardown now and then aborted a
    # rank ("terminate called without an active exception", SIGABRT), a barrier before it too.
    os._exit(0)


@pytest.mark.gloo
def test_summary_names_the_rank_that_went_nonfinite_first(tmp_path: Path) -> None:
    mp.spawn(_rank_main, args=(str(tmp_path),), nprocs=WORLD, join=True)
    reports = [
        RankOverflowReport.from_dict(json.loads((tmp_path / f"rank{r}.json").read_text()))
        for r in range(WORLD)
    ]
    assert [(r.rank, r.steps, r.readbacks) for r in reports] == [(0, 2, 2), (1, 2, 2)]
    s = summarize(reports)
    assert (s.first_rank, s.origin, s.received, s.clean) == (1, (1,), (0,), ())
    first = s.first
    assert first is not None
    assert (first.step, first.module, first.phase, first.name) == (0, "2", Phase.FORWARD, "output")
    got = reports[0].first  # rank 0 first sees it in the averaged weights of the next step
    assert got is not None
    assert (got.step, got.module, got.phase, got.name) == (1, "0", Phase.FORWARD, "weight")
    assert str(s).splitlines()[1].startswith("rank 0 received it later")
