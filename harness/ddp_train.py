"""A DDP training job for the tests of attaching without the agent, run by plain torchrun: gloo
on CPU, a small model wrapped in DistributedDataParallel, so the gradients' all_reduce runs in
DDP's reducer (C++, during backward), not in a Python call of `torch.distributed`.

MODE (environment): `ok` (the default: steps with a short sleep each, STEPS of them, 0 for no
end), `hang` (rank 1 leaves the loop after step SKIP_AT to save a "checkpoint" it never
finishes, while rank 0 goes on into the next step's backward and waits there, in the reducer's
all_reduce of a gradient bucket).
"""

import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

MODE = os.environ.get("MODE", "ok")
STEPS = int(os.environ.get("STEPS", "0"))
SKIP_AT = int(os.environ.get("SKIP_AT", "3"))
PAUSE_S = float(os.environ.get("PAUSE_S", "0.05"))


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    layers = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    model = DistributedDataParallel(layers)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(rank)
    step = 0
    while STEPS == 0 or step < STEPS:
        x = torch.randn(4, 8, generator=data)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()  # the gradients' all_reduce
        opt.step()
        print(f"step {rank} {step}", flush=True)
        if MODE == "hang" and rank == 1 and step == SKIP_AT:
            time.sleep(3600)  # "saving a checkpoint"
        time.sleep(PAUSE_S)
        step += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
