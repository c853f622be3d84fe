"""A torchrun training script as users write it, whose slowness is known: DDP over gloo, a
DataLoader with a DistributedSampler, and on rank 1 a Dataset whose `__getitem__` takes
`SLOW_MS` (default 10) per sample, so its DataLoader's next() takes 4 x that per batch. It trains
for `EPOCHS` epochs (default: until ended), printing `step <rank> <n>` every 10 steps; the attach
tests profile it (`%dist_attach --profile N`)."""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

SLOW_S = float(os.environ.get("SLOW_MS", "10")) / 1000
EPOCHS = int(os.environ.get("EPOCHS", "1000000"))


class Samples(Dataset):
    def __init__(self, slow: bool) -> None:
        self.slow = slow

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.slow:
            time.sleep(SLOW_S)  # a slow disk, a remote bucket, a heavy transform
        return torch.randn(64), torch.randn(1)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = Samples(slow=rank == 1)
    loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data))
    step = 0
    for epoch in range(EPOCHS):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step % 10 == 0:  # one write: the ranks share the log, line by line
                sys.stdout.write(f"step {rank} {step}\n")
                sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
