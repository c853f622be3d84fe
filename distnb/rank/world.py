"""The default process group a distnb rank owns, and user code that asks to make or end one.

distnb makes the default group when a rank starts (`World.create`). Code written for torchrun
calls `dist.init_process_group()` itself and `dist.destroy_process_group()` at its end, so
`hook()` puts two stand-ins in `torch.distributed`:

- `init_process_group(...)` returns at once when it asks for the group that exists (see
  `torchrun.init_difference`), raises `ValueError` naming the difference when it does not, and
  makes distnb's group again when user code destroyed it earlier in the same cell.
- `destroy_process_group()` first passes a barrier, which the checked runtime watches like any
  collective: a rank that never destroys is named by the referee instead of leaving the other
  waiting. Then every rank destroys its groups and tells the checked runtime to forget them, as
  torch's teardown expects; the group stays gone for the rest of the cell (as under torchrun) and
  is made again when the cell ends (`restore`), under a fresh rendezvous prefix, so the next cell
  has a working, checked group.

The barrier's work is kept until then. gloo's barrier holds the works still in progress when it
was called (the script's last all_reduce, often), and their tensors have Python objects (distnb's
kernels saw them). Dropped by gloo's worker thread, those objects need the GIL; and a DDP model
freed as the script's `main()` returns takes the group with it, whose destructor joins that
thread while holding the GIL: both waited for ever (seen once in a test run). Kept here, the
work is freed in this thread, at `restore`, long after the worker let go of it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from distnb.contract import keys, posts
from distnb.contract.signed import take_forged
from distnb.rank import checked, fresh
from distnb.rank.fresh.torchstate import lost_groups
from distnb.rank.torchrun import InitCall, init_difference
from distnb.records.cell import RankSpec

__all__ = ["World"]

# torch's own functions, kept before `hook()` replaces them (distnb itself always calls these).
_init: Callable[..., None] = c10d.init_process_group
_destroy: Callable[..., None] = c10d.destroy_process_group


@dataclass
class World:
    """Rank `spec.rank`'s default group: made `epoch` + 1 times so far in this session."""

    spec: RankSpec
    store: dist.Store
    device: torch.device
    epoch: int = 0
    # the destroy barrier's work, until `restore` (see the module)
    _destroyed: Any = field(default=None, init=False, repr=False)
    _lost: int = field(default=0, init=False, repr=False)  # sub-groups a cell's destroy ended

    def create(self) -> None:
        """Join the other ranks in a new default group (every rank calls it alike)."""
        prefix = keys.process_group(self.epoch)
        if self.epoch:
            # Made again after user code destroyed it: wait for every rank in Python, where
            # Ctrl-C and the cell's timeout reach it, rather than inside gloo's connect.
            _gather_at(self.store, self.epoch, self.spec.rank, self.spec.world_size)
        _init(
            self.spec.backend,
            store=dist.PrefixStore(prefix, self.store),
            rank=self.spec.rank,
            world_size=self.spec.world_size,
            timeout=timedelta(seconds=self.spec.pg_timeout_s),
            device_id=self.device if self.spec.backend == "nccl" else None,
        )

    def restore(self) -> None:
        """Make the group again if user code destroyed it (every rank alike, as they destroyed
        it together): at the end of that cell, or when user code initialises it again."""
        if not dist.is_initialized():
            self._destroyed = None
            self.epoch += 1
            self.create()
            if self._lost:
                print(lost_groups("this cell's", self._lost), file=sys.stderr)
                self._lost = 0

    def destroy(self) -> None:
        """Leave the default group for good (the rank shuts down)."""
        if dist.is_initialized():
            _destroy()

    # --- what user code calls ------------------------------------------------------------

    def init_process_group(
        self,
        backend: str | None = None,
        init_method: str | None = None,
        timeout: timedelta | None = None,
        world_size: int = -1,
        rank: int = -1,
        store: dist.Store | None = None,
        group_name: str = "",
        pg_options: Any = None,
        device_id: torch.device | int | None = None,
        **_: Any,
    ) -> None:
        """torch's `init_process_group`, answered by the group distnb made (see the module)."""
        device = _device_text(device_id, self.device)
        asked = InitCall(backend, init_method, world_size, rank, store is not None, device)
        difference = init_difference(
            asked, self.spec.backend, self.spec.rank, self.spec.world_size, str(self.device)
        )
        if difference:
            raise ValueError(
                f"init_process_group asks for another process group than the one distnb made "
                f"for this rank: {difference}. distnb's ranks already form the default group "
                f"({self.spec.backend}, {self.spec.world_size} ranks); call "
                "dist.init_process_group() with no arguments (or matching ones) to use it, or "
                "restart the session with the backend you need (%dist_start --backend ...)."
            )
        self.restore()

    def destroy_process_group(self, group: Any = None) -> None:
        """torch's `destroy_process_group`: see the module for what it does to the default."""
        if group is not None and group is not dist.GroupMember.WORLD:
            _destroy(group)
            return
        if not dist.is_initialized():
            _destroy()  # torch's own error: nothing to destroy
            return
        # checked: every rank destroys together, or the laggard is named
        self._destroyed = dist.barrier(async_op=True)
        self._destroyed.wait()
        if not fresh.running():  # a run's groups are its own (`fresh` says what it ended)
            self._lost = sum(pg is not dist.GroupMember.WORLD for pg in c10d._world.pg_map)
        _destroy()
        checked.forget_groups()

    def hook(self) -> None:
        """Answer user code's init/destroy calls from now on (see the module)."""
        _install(self.init_process_group, self.destroy_process_group)

    @staticmethod
    def unhook() -> None:
        _install(_init, _destroy)


def _install(init: Callable[..., None], destroy: Callable[..., None]) -> None:
    # `torch.distributed` re-exports c10d's functions: replace both names.
    for module in (dist, c10d):
        setattr(module, "init_process_group", init)  # noqa: B010
        setattr(module, "destroy_process_group", destroy)  # noqa: B010


def _device_text(device_id: torch.device | int | None, own: torch.device) -> str | None:
    """A user's `device_id` as text comparable with the rank's device (no index: its type)."""
    if device_id is None:
        return None
    device = torch.device("cuda", device_id) if isinstance(device_id, int) else device_id
    if device.index is None and device.type == own.type:
        return str(own)
    return str(device)


def _gather_at(store: dist.Store, epoch: int, rank: int, world_size: int) -> None:
    """Wait until every rank has arrived at re-making the group for `epoch` (an arrival a
    stranger overwrote is asked for again from its rank: `distnb.contract.posts`)."""
    posts.drop(keys.group_arrival(epoch - 1, rank))  # every rank has made that group
    posts.post(store, keys.group_arrival(epoch, rank), "1")
    names = [keys.group_arrival(epoch, r) for r in range(world_size)]
    pause = 0.001
    while not store.check(names):
        posts.ask_again(store, take_forged(store))
        time.sleep(pause)  # a Python sleep: KeyboardInterrupt lands here
        pause = min(pause * 2, 0.05)
