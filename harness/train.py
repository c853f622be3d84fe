"""A small training job for the attach tests, run by torchrun (`python -m distnb.run ...` or
plain `torchrun`): gloo on CPU, a linear model, two same-sized all_reduces per step (gradients,
then metrics), so a rank that skips one does not abort gloo but hangs later, as real jobs do.

MODE (environment): `ok` (the default), `hang` (rank 1 skips the metrics all_reduce of step
SKIP_AT, then every rank saves a "checkpoint" it never finishes: rank 0 waits for rank 1 in its
last all_reduce), `mismatch` (at step SKIP_AT the ranks broadcast tensors of different shapes:
plain gloo gives rank 1 a half-written tensor, silently), `nan` (rank 1's batch of step SKIP_AT
holds an inf: every rank's weights go NaN), `drift` (from step SKIP_AT on, rank 1 averages its
gradients over one rank too few: its weights drift from its peers'), `uneven` (rank 1's data
runs out at step SKIP_AT: it leaves the loop and its script ends, while rank 0 goes on to its
next all_reduce), `wait` (as `ok`). With
READY set, every rank waits for that file before each step: a job still running when the test
looks.
LINGER: every mode ends in the "checkpoint" sleep, so the job is there to attach to. The final
loss is printed with all its bits (`final <rank> <loss.hex()>`).
"""

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

MODE = os.environ.get("MODE", "ok")
STEPS = int(os.environ.get("STEPS", "20"))
SKIP_AT = int(os.environ.get("SKIP_AT", "5"))
READY = Path(os.environ.get("READY", "/nonexistent"))


def grads_of(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(rank)
    loss = torch.zeros(())
    warm = min(10, STEPS - 1)
    for step in range(STEPS):
        if MODE == "uneven" and rank == 1 and step == SKIP_AT:
            break  # rank 1's data ran out: it leaves the loop, and its script ends
        if step == warm:
            t0 = time.perf_counter()
        while "READY" in os.environ and not READY.exists():
            time.sleep(0.01)
        x = torch.randn(4, 8, generator=data)
        if MODE == "nan" and rank == 1 and step == SKIP_AT:
            x[0, 0] = float("inf")
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        flat = grads_of(model)
        dist.all_reduce(flat)  # the gradients
        metrics = torch.full((9,), loss.item())
        if not (MODE == "hang" and rank == 1 and step == SKIP_AT):
            dist.all_reduce(metrics)  # the metrics
        if MODE == "mismatch" and step == SKIP_AT:
            dist.broadcast(torch.zeros(4 + 4 * rank), src=0)
        start, over = 0, dist.get_world_size()
        if MODE == "drift" and rank == 1 and step >= SKIP_AT:
            over -= 1  # the bug
        for p in model.parameters():
            p.grad.copy_(flat[start : start + p.numel()].view_as(p) / over)
            start += p.numel()
        opt.step()
    per_step = (time.perf_counter() - t0) / max(1, STEPS - warm) if step >= warm else 0.0
    print(f"final {rank} {loss.item().hex()} step_s {per_step:.9f}", flush=True)
    if MODE == "hang" or os.environ.get("LINGER"):
        time.sleep(3600)  # "saving a checkpoint"
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
