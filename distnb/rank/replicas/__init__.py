"""Replica checks on a rank: the tensors named, their replica groups and digests of their bits.

What should be identical across ranks follows from how it was made (see `replica_group`): a DDP
model's parameters across its process group, a DTensor along the mesh dimensions where its
placement is `Replicate` (and along the dimensions of the whole mesh that a sliced mesh leaves
out: TP shards across data parallel), a plain tensor across the world. Digests read a tensor's
bits as integers, mixed with their position, on the tensor's own device (a sum of values would
hide a swap, or cancel out), and reach the host in one read per device.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from distnb.records.replicas import Digest

__all__ = ["Entry", "digests", "digests_of", "entries_of", "replica_group"]

# Word (r, c) of a tensor seen as rows of `_COLS` int64 words weighs `col[c] * row[r]`, both of
# the form `i * A + B` (odd, so their product is odd); int64 arithmetic wraps.
_COLS = 256  # measured here: a (rows, 256) int64 matrix-vector product runs ~3x a 1-D dot's speed
_A, _B = 0x9E3779B97F4A7C15 - 2**64, 0x632BE59BD9B4E019
_A2, _B2 = 0x2545F4914F6CDD1D, 0x5851F42D4C957F2D
_VALUES = (int, float, bool, str, type(None))

Entry = tuple[str, Any, tuple[int, ...]]  # name, tensor or plain value, replica group


def digests(names: Sequence[str], grads: bool, buffers: bool) -> list[Digest]:
    """A `Digest` of every tensor and value under `names` in this rank's namespace."""
    return digests_of(list(entries_of(names, grads, buffers)))


def digests_of(found: Sequence[Entry]) -> list[Digest]:
    """A `Digest` of each entry (see `entries_of`)."""
    rank = dist.get_rank()
    tensors = [(i, t) for i, (_, t, _) in enumerate(found) if isinstance(t, torch.Tensor)]
    sums = _bits([t for _, t in tensors])
    bits = {i: s for (i, _), s in zip(tensors, sums)}
    out = []
    for i, (name, obj, group) in enumerate(found):
        if isinstance(obj, torch.Tensor):
            shape, dtype = tuple(obj.shape), str(obj.dtype).removeprefix("torch.")
            nbytes = obj.numel() * obj.element_size()
            out.append(Digest(name, rank, group, bits[i], shape, dtype, nbytes))
        else:
            out.append(Digest(name, rank, group, "", value=repr(obj)))
    return out


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


def _bits(tensors: Sequence[torch.Tensor]) -> list[str]:
    """Each tensor's digest, as 16 hex digits; one read to the host per device."""
    sums: dict[torch.device, list[torch.Tensor]] = {}
    order = []
    for t in tensors:
        sums.setdefault(t.device, []).append(_digest(_words(t)))
        order.append((t.device, len(sums[t.device]) - 1))
    read = {device: torch.stack(hs).tolist() for device, hs in sums.items()}
    return [f"{read[device][i] % 2**64:016x}" for device, i in order]


def _words(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as int64 words, without a copy where its memory allows (the last
    0-7 bytes, if any, as words of their own)."""
    flat = t.detach().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    elif flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    raw = flat.contiguous().view(torch.uint8)
    whole = raw.numel() // 8 * 8
    if raw.storage_offset() % 8:  # a view at an odd place in its storage: realign
        raw = raw.clone()
    words = raw[:whole].view(torch.int64)
    if whole == raw.numel():
        return words
    return torch.cat([words, raw[whole:].to(torch.int64)])


def _digest(words: torch.Tensor) -> torch.Tensor:
    """One pass: the words as rows of `_COLS` (the last one short), each row's words weighted by
    column, the rows' sums weighted by row, all modulo 2**64. A changed word changes it (its
    weight is odd), and so does a swapped or shifted one (its weight is another)."""
    full, tail = divmod(words.numel(), _COLS)
    cols = _weights(words.device, _COLS, _A, _B)
    by_row = _weights(words.device, full + 1, _A2, _B2)
    h = _dot(words[full * _COLS :], cols[:tail]) * by_row[full]
    if full:
        h = h + _dot(_row_sums(words[: full * _COLS].view(full, _COLS), cols), by_row[:full])
    return h


def _row_sums(matrix: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    if matrix.device.type == "cpu":
        return torch.mv(matrix, cols)
    return (matrix * cols).sum(1)  # CUDA has no integer matrix products


def _dot(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if x.device.type == "cpu":
        return torch.dot(x, w)  # one pass, no temporary
    return (x * w).sum()  # CUDA has no integer dot


_WEIGHTS: dict[tuple[torch.device, int], torch.Tensor] = {}


def _weights(device: torch.device, n: int, a: int, b: int) -> torch.Tensor:
    """`i * a + b` for i < n; kept per device, grown to the largest n asked for."""
    have = _WEIGHTS.get((device, a))
    if have is None or have.numel() < n:
        at = torch.arange(max(n, 2 * (have.numel() if have is not None else 0)), device=device)
        have = _WEIGHTS[(device, a)] = at * a + b
    return have[:n]
