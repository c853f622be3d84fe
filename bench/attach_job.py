"""The training job `bench/bench_attach.py` times under plain torchrun and under
`python -m distnb.run` (the agent loaded, nobody attached): gloo on CPU, 2 ranks by default.

WORK (environment): `tiny`, a step that is almost only collectives (a linear layer of 9
parameters, its gradients and a metric all_reduced with `dist.all_reduce`: the agent's worst
case), or `mlp`, the small MLP of `bench_training.py` (64-256-256-10, batch 32) under DDP (its
gradient bucket all_reduced by DDP's reducer, from C++) and a metric all_reduced. STEPS steps,
the first WARM untimed; each rank prints `step_s <its mean step time>`.
"""

import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

WORK = os.environ.get("WORK", "tiny")
STEPS = int(os.environ.get("STEPS", "300"))
WARM = 20


def model_and_batch(rank: int) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    data = torch.Generator().manual_seed(rank)
    if WORK == "tiny":
        return torch.nn.Linear(8, 1), torch.randn(4, 8, generator=data), torch.zeros(4, 1)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10),
    )  # fmt: skip
    return DDP(mlp), torch.randn(32, 64, generator=data), torch.randn(32, 10, generator=data)


def step(
    model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> None:
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    if WORK == "tiny":  # no DDP: the gradients by hand
        flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        dist.all_reduce(flat)
    metric = loss.detach().reshape(1)
    dist.all_reduce(metric)
    opt.step()


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, x, y = model_and_batch(rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    for i in range(STEPS):
        if i == WARM:
            dist.barrier()
            t0 = time.perf_counter()
        step(model, opt, x, y)
    print(f"step_s {(time.perf_counter() - t0) / (STEPS - WARM):.9f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
