"""A torchrun job whose ranks wait for each other in a circle across groups: each rank r makes
the groups {r, r+1} (every rank makes every group, in the same order, as torch requires), then
reduces on its own group {r, r+1}, while rank r+1 reduces on {r+1, r+2}: rank r waits for r+1,
which waits for r+2, ... back to r. Every rank first reduces once on the world, so each has a
history."""

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    pairs = [dist.new_group(sorted({r, (r + 1) % world})) for r in range(world)]
    dist.all_reduce(torch.ones(2))  # the world's
    dist.all_reduce(torch.ones(3), group=pairs[rank])  # my pair's: the circle
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
