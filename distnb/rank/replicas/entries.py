"""What a replica check looks at: every tensor and value under the names asked about, each with
its replica group.

What should be identical across ranks follows from how it was made (see `replica_group`): a DDP
model's parameters across its process group, a DTensor along the mesh dimensions where its
placement is `Replicate` (and along the dimensions of the whole mesh that a sliced mesh leaves
out: TP shards across data parallel), a plain tensor across the world.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["Entry", "entries_of", "replica_group"]

_VALUES = (int, float, bool, str, type(None))

Entry = tuple[str, Any, tuple[int, ...]]  # name, tensor or plain value, replica group


def entries_of(
    targets: Sequence[str | Mapping[str, Any]], grads: bool, buffers: bool
) -> Iterator[Entry]:
    """Every tensor and value under `targets` (names looked up as `%dist_shapes` does, or
    `{name: object}`), with its replica group."""
    from distnb.rank.runtime import _lookup

    world = tuple(range(dist.get_world_size()))
    for target in targets:
        named = {target: _lookup(target)} if isinstance(target, str) else target
        for name, obj in named.items():
            yield from _walk(name, obj, world, grads, buffers)


def _walk(
    path: str, obj: Any, group: tuple[int, ...], grads: bool, buffers: bool
) -> Iterator[Entry]:
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(obj, DistributedDataParallel):
        group = tuple(dist.get_process_group_ranks(obj.process_group))
        obj = obj.module
    if isinstance(obj, nn.Module):
        for name, p in obj.named_parameters():
            yield _tensor(f"{path}.{name}", p, group)
            if grads and p.grad is not None:
                yield _tensor(f"{path}.{name}.grad", p.grad, group)
        if buffers:
            for name, b in obj.named_buffers():
                yield _tensor(f"{path}.{name}", b, group)
    elif isinstance(obj, torch.optim.Optimizer):
        yield from _optimizer(path, obj, group)
    elif isinstance(obj, torch.Tensor):
        yield _tensor(path, obj, group)
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from _walk(f"{path}[{key!r}]", value, group, grads, buffers)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from _walk(f"{path}[{i}]", value, group, grads, buffers)
    elif isinstance(obj, _VALUES):
        yield path, obj, group
    else:
        raise TypeError(
            f"{path} is a {type(obj).__name__}: replica checks compare modules, tensors, "
            "optimizers and dicts or lists of them"
        )


def _optimizer(path: str, opt: torch.optim.Optimizer, group: tuple[int, ...]) -> Iterator[Entry]:
    """Hyperparameters (`lr`, `betas`...) and the state of each parameter, by its position."""
    params = [p for g in opt.param_groups for p in g["params"]]
    for i, settings in enumerate(opt.param_groups):
        for key, value in settings.items():
            if key != "params":
                yield from _walk(f"{path}.param_groups[{i}].{key}", value, group, False, False)
    for i, p in enumerate(params):
        for key, value in opt.state.get(p, {}).items():
            yield from _walk(f"{path}.state[{i}].{key}", value, group, False, False)


def _tensor(path: str, t: torch.Tensor, group: tuple[int, ...]) -> Entry:
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        return path, t.to_local().detach(), replica_group(t)
    return path, t.detach(), group


def replica_group(t: Any) -> tuple[int, ...]:
    """The ranks that hold the same local part of DTensor `t`: those at this rank's coordinates
    on every mesh dimension where `t` is not `Replicate`. A mesh sliced from a bigger one (TP's
    `mesh["tp"]`) has replicas along the other dimensions too (data parallel): the group is
    found in the whole mesh, where its dimensions are named."""
    from torch.distributed.device_mesh import _mesh_resources
    from torch.distributed.tensor import Replicate

    mesh = t.device_mesh
    coordinate = mesh.get_coordinate()
    sharded = {d: coordinate[d] for d, p in enumerate(t.placements) if not isinstance(p, Replicate)}
    root, names = _mesh_resources.get_root_mesh(mesh), mesh.mesh_dim_names
    whole = root.mesh_dim_names or ()
    if root is not mesh and names and set(names) <= set(whole):
        mesh, sharded = root, {whole.index(names[d]): c for d, c in sharded.items()}
    index = tuple(sharded.get(d, slice(None)) for d in range(mesh.ndim))
    return tuple(sorted(int(r) for r in mesh.mesh[index].flatten().tolist()))
