"""Records of what tensors and modules a rank holds: the input of the per-rank shape table.

A rank scans its namespace (`distnb.rank.scan.scan_namespace`) and sends back one `ShapeScan`:
metadata only (shape, dtype, device, gradient flags, whether any value is NaN/Inf), never tensor
data. The kernel lines the scans up by name (`distnb.views.shape_table.build_table`).

Terms:

- **entry**: one named thing in a scan: a tensor (`TensorMeta`) or an `nn.Module` summarised over
  its parameters and buffers (`ModuleMeta`). Tensors found inside lists, tuples and dicts are
  named the way you would write them: `batch["x"]`, `xs[0]`, `outs[1]["loss"]`.
- **own device**: the device the rank computes on (`cuda:<local_rank>` or `cpu`). Tables compare
  devices relative to it, so `cuda:0` on rank 0 and `cuda:1` on rank 1 agree, while rank 1 holding
  a tensor on `cuda:0` stands out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar, TypeAlias

from distnb.records.codec import Record, decode

__all__ = ["Entry", "Field", "ModuleMeta", "ShapeScan", "TensorMeta", "entry_from_dict"]


class Field(str, Enum):
    """What can differ between ranks for one name; the table marks these."""

    MISSING = "missing"
    TYPE = "type"
    SHAPE = "shape"
    DTYPE = "dtype"
    DEVICE = "device"
    REQUIRES_GRAD = "requires_grad"
    GRAD = "grad"
    NONFINITE = "nonfinite"


@dataclass(frozen=True, slots=True)
class TensorMeta(Record):
    """One tensor as a rank sees it, without its data.

    `has_nonfinite` is None when it was not checked (checking switched off, a `meta` or sparse
    tensor, a dtype torch cannot reduce). `has_grad`/`grad_nonfinite` describe `.grad`, which is
    only read on leaf tensors and those that `retain_grad()`. For a DTensor, `shape` is the
    global shape and `has_nonfinite` describes this rank's shard.
    """

    kind: ClassVar[str] = "tensor"  # tells entries apart in JSON (see `distnb.records.codec`)

    name: str
    shape: tuple[int, ...]
    dtype: str
    device: str
    requires_grad: bool = False
    has_nonfinite: bool | None = None
    has_grad: bool = False
    grad_nonfinite: bool | None = None

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True, slots=True)
class ModuleMeta(Record):
    """An `nn.Module` summarised over its parameters and buffers.

    Counts come first because a model has thousands of parameters: the table shows one row per
    module and keeps `params`/`buffers` (one `TensorMeta` each, names relative to the module) for
    the expanded view and for finding which parameter differs. `n_nonfinite` counts parameters
    and buffers holding NaN/Inf, `n_grads_nonfinite` gradients; both are None when the check was
    off.
    """

    kind: ClassVar[str] = "module"

    name: str
    type_name: str
    training: bool
    n_params: int
    param_numel: int
    n_buffers: int
    buffer_numel: int
    dtypes: tuple[str, ...]
    devices: tuple[str, ...]
    n_requires_grad: int
    n_grads: int
    n_nonfinite: int | None = None
    n_grads_nonfinite: int | None = None
    params: tuple[TensorMeta, ...] = ()
    buffers: tuple[TensorMeta, ...] = ()

    @property
    def has_nonfinite(self) -> bool | None:
        """Whether any parameter, buffer or gradient holds NaN/Inf (None: not checked)."""
        if self.n_nonfinite is None or self.n_grads_nonfinite is None:
            return None
        return self.n_nonfinite > 0 or self.n_grads_nonfinite > 0


Entry: TypeAlias = TensorMeta | ModuleMeta


def entry_from_dict(d: Mapping[str, Any]) -> Entry:
    """Rebuild a `TensorMeta` or `ModuleMeta` from its `to_dict()` form (told apart by `kind`)."""
    kind = d.get("kind")
    if kind == TensorMeta.kind:
        return decode(TensorMeta, d)
    if kind == ModuleMeta.kind:
        return decode(ModuleMeta, d)
    raise ValueError(f"unknown shape-scan entry kind {kind!r}; expected 'tensor' or 'module'")


@dataclass(frozen=True, slots=True)
class ShapeScan(Record):
    """Everything one rank reported: its entries in namespace order.

    `device` is the rank's own device (see the module docstring). `truncated` counts tensors left
    out because a container or the whole scan hit its limit; `not_found` lists names that were
    asked for explicitly but are not defined on this rank.
    """

    rank: int
    entries: tuple[Entry, ...]
    device: str = "cpu"
    truncated: int = 0
    not_found: tuple[str, ...] = ()
