"""One rank's call, described: what goes into its fingerprint, and the group it goes to.

A `Call` never holds tensor data: shapes, dtypes and device types only (`spec`). Groups are
named by their registered name (`pg.group_name`), the one name every caller shares: the Python
functions pass a `ProcessGroup`, the dispatcher a boxed one, functional collectives the name.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

__all__ = [
    "Call",
    "Core",
    "Spec",
    "Unchecked",
    "group_name",
    "local",
    "nbytes",
    "reduce_name",
    "spec",
    "specs",
    "splits",
]

# (shape, dtype name, device type): a plain tuple, so it marshals into a fingerprint as is
Spec = tuple[tuple[int, ...], str, str]
# (op, inputs, outputs, reduce op, root, peer, in splits, out splits, count, finite, tag, params)
Core = tuple[Any, ...]

_dtype_names: dict[torch.dtype, str] = {}
# ReduceOp.RedOpType values, as the dispatcher's boxed ReduceOp reports them (`.op()`)
_REDUCE_NAMES = {v.value: name for name, v in dist.ReduceOp.RedOpType.__members__.items()}
_funcol_reduce: dict[str, str] = {}


class _Local(threading.local):
    """What the checked runtime keeps per thread."""

    depth = 0  # > 0 inside a checked op (the ops it makes in turn pass through)
    context: Any = None  # what a Python-level caller adds (`intercept.Context`)
    ddp_model: Any = None  # the DDP model being built (see `context`)
    unwaited: list[Any] | None = None  # the event of the last synchronous op, until its wait


local = _Local()


class Unchecked(Exception):
    """This call goes to the backend unchecked (it cannot be described, or torch will reject it)."""


class Call:
    """One rank's call: its fingerprint's core, its group, and what the timeline records."""

    __slots__ = (
        "async_op",
        "count",
        "group",
        "in_splits",
        "inputs",
        "nbytes",
        "op",
        "out_splits",
        "outputs",
        "params",
        "peer",
        "reduce",
        "reduce_op",
        "root",
        "tag",
    )

    def __init__(
        self,
        op: str,
        group: str,
        inputs: tuple[Spec, ...] = (),
        outputs: tuple[Spec, ...] = (),
        *,
        reduce_op: str = "",
        root: int | None = None,
        peer: int | None = None,
        in_splits: tuple[int, ...] | None = None,
        out_splits: tuple[int, ...] | None = None,
        count: int | None = None,
        tag: int = 0,
        async_op: bool = False,
        nbytes: int = 0,
        reduce: tuple[torch.Tensor, ...] = (),
    ) -> None:
        self.op = op
        self.group = group  # the group's registered name
        self.inputs = inputs
        self.outputs = outputs
        self.reduce_op = reduce_op
        self.root = root  # group rank, as the backend takes it
        self.peer = peer  # group rank
        self.in_splits = in_splits
        self.out_splits = out_splits
        self.count = count
        self.tag = tag
        self.async_op = async_op
        self.nbytes = nbytes
        # the tensors `check_finite` looks at (reductions only)
        self.reduce = reduce
        # what the Python-level caller adds (a DDP model's parameters), see `context`
        self.params: tuple[tuple[str, Spec], ...] = ()

    def core(self, finite: bool | None, root: int | None, peer: int | None) -> Core:
        """The compared part; `root`/`peer` as global ranks."""
        return (
            self.op,
            self.inputs,
            self.outputs,
            self.reduce_op,
            root,
            peer,
            self.in_splits,
            self.out_splits,
            self.count,
            finite,
            self.tag,
            self.params,
        )


def spec(t: torch.Tensor) -> Spec:
    name = _dtype_names.get(t.dtype)
    if name is None:
        name = _dtype_names[t.dtype] = str(t.dtype).removeprefix("torch.")
    # `t.device` builds a new object each time; `is_cpu` is 7x cheaper for the common case
    return tuple(t.shape), name, "cpu" if t.is_cpu else t.device.type


def specs(ts: Sequence[torch.Tensor] | None) -> tuple[Spec, ...]:
    return () if ts is None else tuple(spec(t) for t in ts)


def nbytes(ts: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def splits(sizes: Sequence[int]) -> tuple[int, ...] | None:
    """Split sizes as a tuple; None for an even split (the ops take an empty list for it)."""
    return tuple(int(s) for s in sizes) if sizes else None


def group_name(pg: Any) -> str:
    """The registered name of a group: from a `ProcessGroup`, a boxed one, a name, or None."""
    if isinstance(pg, str):
        return pg
    if pg is None:
        pg = c10d._get_default_group()
    elif isinstance(pg, torch.ScriptObject):
        pg = dist.ProcessGroup.unbox(pg)
    return str(pg.group_name)


def reduce_name(op: Any) -> str:
    """`SUM`, `MAX`, ... from a boxed ReduceOp, a `ReduceOp`, or a functional op's `"sum"`."""
    if isinstance(op, torch.ScriptObject):
        # a boxed c10d::ReduceOp: its one TorchScript method says which op it is
        return _REDUCE_NAMES.get(int(op.op()), "UNKNOWN")  # type: ignore[attr-defined]
    if isinstance(op, str):
        name = _funcol_reduce.get(op)
        if name is None:
            name = _funcol_reduce[op] = op.upper()
        return name
    with contextlib.suppress(AttributeError, TypeError, ValueError):
        return _REDUCE_NAMES[int(op)]
    return str(getattr(op, "name", None) or op).rsplit(".", 1)[-1]
