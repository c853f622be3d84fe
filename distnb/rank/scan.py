"""Scan a rank's namespace for tensors and modules: the per-rank side of the shape table.

Only metadata leaves the rank: shapes, dtypes, devices, gradient flags and one bit per tensor
saying whether it holds NaN/Inf.

Cost, decided here: the NaN/Inf bit needs a reduction over each tensor's data, so it is computed
for the whole scan in one batched pass instead of per tensor. Tensors are bucketed by (device,
dtype); each bucket is reduced with `torch._foreach_norm(ord=inf)` (multi-tensor kernels on CUDA,
one C++ loop on CPU; a NaN or Inf anywhere makes the max-abs NaN or Inf), and the per-tensor
results are copied to the host once per device. So a model with thousands of parameters costs a
few kernel launches and one host sync per device, not one sync per tensor. It still reads every
floating tensor once; `nonfinite=False` skips the pass (the bits are then None).
"""

from __future__ import annotations

import json
import math
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from distnb.records.shapes import Entry, ModuleMeta, ShapeScan, TensorMeta

__all__ = ["nonfinite_flags", "resolve", "scan_namespace"]

# IPython's own names: `Out` keeps every displayed result alive and would list old tensors.
IPYTHON_NAMES = frozenset({"In", "Out", "exit", "quit", "get_ipython"})

MAX_DEPTH = 3  # containers inside containers: batch["x"][0][1] is as deep as we look
MAX_ITEMS = 256  # elements looked at per list/tuple/dict
MAX_ENTRIES = 10_000  # entries per scan


def scan_namespace(
    ns: Mapping[str, object],
    names: Sequence[str] | None = None,
    *,
    include_all: bool = False,
    rank: int,
    device: str | None = None,
    nonfinite: bool = True,
    module_detail: bool = True,
    max_depth: int = MAX_DEPTH,
    max_items: int = MAX_ITEMS,
    max_entries: int = MAX_ENTRIES,
) -> ShapeScan:
    """Describe the tensors and `nn.Module`s in `ns` (a rank's globals) without their data.

    With `names`, only those (dotted attribute paths such as `"model.encoder"` work, `_`-prefixed
    names too); otherwise every public name, skipping `_`-prefixed and IPython's names unless
    `include_all`. Tensors inside lists, tuples and dicts are found `max_depth` levels down, at
    most `max_items` per container. `device` is the rank's own device (default: the current CUDA
    device if CUDA is initialised, else `"cpu"`).

    Example::

        scan = scan_namespace(globals(), rank=dist.get_rank())
        payload = scan.to_dict()  # JSON-able: send it to the kernel
    """
    walker = _Walker(
        check=_NonfiniteCheck(enabled=nonfinite),
        module_detail=module_detail,
        max_depth=max_depth,
        max_items=max_items,
        max_entries=max_entries,
    )
    not_found: list[str] = []
    for name, value in _roots(ns, names, include_all, not_found):
        walker.walk(name, value, depth=0)
    walker.check.run()
    return ShapeScan(
        rank=rank,
        entries=tuple(build() for build in walker.builders),
        device=device if device is not None else _own_device(),
        truncated=walker.truncated,
        not_found=tuple(not_found),
    )


def nonfinite_flags(tensors: Sequence[torch.Tensor]) -> list[bool | None]:
    """For each tensor, whether it holds a NaN or Inf; None where that cannot be computed.

    One batched reduction per (device, dtype) and one host copy per device; see the module
    docstring. Integer and bool tensors are always finite; empty ones too. A DTensor answers for
    its local shard: no collective runs.
    """
    flags: list[bool | None] = [None] * len(tensors)
    buckets: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    tensors = [_local(t) for t in tensors]
    for i, t in enumerate(tensors):
        if t.layout != torch.strided or t.device.type == "meta":
            continue
        if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
            flags[i] = False
            continue
        buckets.setdefault((t.device, t.dtype), []).append(i)
    per_device: dict[torch.device, list[tuple[list[int], torch.Tensor]]] = {}
    with torch.no_grad():
        for (dev, _), idx in buckets.items():
            bad = _bucket_nonfinite([tensors[i] for i in idx])
            if bad is not None:
                per_device.setdefault(dev, []).append((idx, bad))
        for parts in per_device.values():
            # The one host sync for this device.
            values = torch.cat([bad for _, bad in parts]).tolist()
            order = [i for idx, _ in parts for i in idx]
            for i, v in zip(order, values, strict=True):
                flags[i] = bool(v)
    return flags


def _local(t: torch.Tensor) -> torch.Tensor:
    """The rank's own data: a DTensor (FSDP2 parameters, tensor parallel) reduced as a whole
    would run a collective from this rank alone, and hang; its local shard needs none."""
    if type(t).__name__ == "DTensor" and hasattr(t, "to_local"):
        local: torch.Tensor = t.to_local()
        return local
    return t


def _bucket_nonfinite(ts: list[torch.Tensor]) -> torch.Tensor | None:
    """A bool tensor on the bucket's device: True where a tensor has NaN/Inf."""
    try:
        norms = torch._foreach_norm(ts, ord=math.inf)
        return ~torch.isfinite(torch.stack(list(norms)))
    except (RuntimeError, NotImplementedError):
        pass  # e.g. float8 has no norm kernel; isfinite may still work per tensor
    try:
        return torch.stack([~torch.isfinite(t).all() for t in ts])
    except (RuntimeError, NotImplementedError):
        return None


def _roots(
    ns: Mapping[str, object],
    names: Sequence[str] | None,
    include_all: bool,
    not_found: list[str],
) -> Iterator[tuple[str, object]]:
    if names is not None:
        for name in names:
            found, value = _resolve(ns, name)
            if found:
                yield name, value
            else:
                not_found.append(name)
        return
    for name, value in list(ns.items()):
        if not include_all and (name.startswith("_") or name in IPYTHON_NAMES):
            continue
        # Modules and functions hold no tensors we would show; not walking them keeps a
        # notebook's `import torch` from dragging the scan through torch's globals.
        if isinstance(value, types.ModuleType | types.FunctionType | type):
            continue
        yield name, value


def _resolve(ns: Mapping[str, object], path: str) -> tuple[bool, object]:
    head, *attrs = path.split(".")
    if head not in ns:
        return False, None
    value = ns[head]
    for attr in attrs:
        if not hasattr(value, attr):
            return False, None
        value = getattr(value, attr)
    return True, value


@dataclass(slots=True)
class _NonfiniteCheck:
    """Collects tensors during the walk; answers for all of them after one batched pass."""

    enabled: bool
    tensors: list[torch.Tensor] = field(default_factory=list)
    index: dict[int, int] = field(default_factory=dict)
    flags: list[bool | None] = field(default_factory=list)

    def add(self, t: torch.Tensor | None) -> int:
        if t is None or not self.enabled:
            return -1
        i = self.index.get(id(t))
        if i is None:
            i = self.index[id(t)] = len(self.tensors)
            self.tensors.append(t)
        return i

    def run(self) -> None:
        self.flags = nonfinite_flags(self.tensors) if self.enabled else []

    def flag(self, i: int) -> bool | None:
        return None if i < 0 else self.flags[i]


@dataclass(slots=True)
class _Walker:
    """Finds tensors and modules; records are built after the batched check (`builders`)."""

    check: _NonfiniteCheck
    module_detail: bool
    max_depth: int
    max_items: int
    max_entries: int
    builders: list[Callable[[], Entry]] = field(default_factory=list)
    truncated: int = 0
    _open: set[int] = field(default_factory=set)  # containers on the current path (cycles)

    def walk(self, name: str, value: object, depth: int) -> None:
        if isinstance(value, list | tuple | Mapping):
            self._walk_container(name, value, depth)
        elif not isinstance(value, torch.Tensor | nn.Module):
            return
        elif len(self.builders) >= self.max_entries:
            self.truncated += 1
        elif isinstance(value, torch.Tensor):
            self.builders.append(_tensor_builder(name, value, self.check))
        else:
            self.builders.append(_module_builder(name, value, self.check, self.module_detail))

    def _walk_container(
        self,
        name: str,
        value: list[object] | tuple[object, ...] | Mapping[object, object],
        depth: int,
    ) -> None:
        if depth >= self.max_depth or id(value) in self._open or len(value) == 0:
            return
        self._open.add(id(value))
        items = value.items() if isinstance(value, Mapping) else enumerate(value)
        for n, (key, item) in enumerate(items):
            if n >= self.max_items:
                self.truncated += len(value) - n
                break
            self.walk(f"{name}[{_key_repr(key)}]", item, depth + 1)
        self._open.discard(id(value))


def _tensor_builder(name: str, t: torch.Tensor, check: _NonfiniteCheck) -> Callable[[], Entry]:
    # .grad of a non-leaf is only kept after retain_grad(); reading it otherwise makes torch warn.
    grad = t.grad if t.requires_grad and (t.is_leaf or t.retains_grad) else None
    i, gi = check.add(t), check.add(grad)

    def build() -> Entry:
        return _tensor_meta(name, t, grad, check.flag(i), check.flag(gi))

    return build


def _tensor_meta(
    name: str,
    t: torch.Tensor,
    grad: torch.Tensor | None,
    bad: bool | None,
    grad_bad: bool | None,
) -> TensorMeta:
    return TensorMeta(
        name=name,
        shape=tuple(t.shape),
        dtype=_dtype_name(t.dtype),
        device=str(t.device),
        requires_grad=t.requires_grad,
        has_nonfinite=bad,
        has_grad=grad is not None,
        grad_nonfinite=grad_bad if grad is not None else None,
    )


def _module_builder(
    name: str, module: nn.Module, check: _NonfiniteCheck, detail: bool
) -> Callable[[], Entry]:
    params = [(n, p, p.grad) for n, p in module.named_parameters()]
    buffers = list(module.named_buffers())
    p_idx = [(check.add(p), check.add(g)) for _, p, g in params]
    b_idx = [check.add(b) for _, b in buffers]

    def build() -> Entry:
        pmeta = [
            _tensor_meta(n, p, g, check.flag(i), check.flag(gi))
            for (n, p, g), (i, gi) in zip(params, p_idx, strict=True)
        ]
        bmeta = [
            _tensor_meta(n, b, None, check.flag(i), None)
            for (n, b), i in zip(buffers, b_idx, strict=True)
        ]
        return _module_meta(name, module, pmeta, bmeta, check.enabled, detail)

    return build


def _module_meta(
    name: str,
    module: nn.Module,
    params: list[TensorMeta],
    buffers: list[TensorMeta],
    checked: bool,
    detail: bool,
) -> ModuleMeta:
    tensors = [*params, *buffers]
    return ModuleMeta(
        name=name,
        type_name=type(module).__name__,
        training=module.training,
        n_params=len(params),
        param_numel=sum(p.numel for p in params),
        n_buffers=len(buffers),
        buffer_numel=sum(b.numel for b in buffers),
        dtypes=tuple(sorted({t.dtype for t in tensors})),
        devices=tuple(sorted({t.device for t in tensors})),
        n_requires_grad=sum(p.requires_grad for p in params),
        n_grads=sum(p.has_grad for p in params),
        n_nonfinite=sum(bool(t.has_nonfinite) for t in tensors) if checked else None,
        n_grads_nonfinite=sum(bool(p.grad_nonfinite) for p in params) if checked else None,
        params=tuple(params) if detail else (),
        buffers=tuple(buffers) if detail else (),
    )


def _key_repr(key: object) -> str:
    if isinstance(key, str):
        text = json.dumps(key)  # batch["x"], as the user would type it
    elif isinstance(key, int | float | bool) or key is None:
        text = repr(key)
    else:
        text = f"<{type(key).__name__}>"
    return text if len(text) <= 40 else text[:37] + "..."


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _own_device() -> str:
    # is_initialized(), not is_available(): a CPU-only session must not start a CUDA context.
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"


def resolve(names: Mapping[str, Any], path: str, missing: str) -> Any:
    """`model` or `model.encoder` among `names`, or a NameError of `missing` (its `{name}`:
    the first part of the path)."""
    head, *rest = path.split(".")
    if head not in names:
        raise NameError(missing.format(name=head))
    obj = names[head]
    for part in rest:
        obj = getattr(obj, part)
    return obj
