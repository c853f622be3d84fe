"""What each `torch.distributed` call is about to do, read from its arguments: a `Call`.

One describer per wrapped function, with the function's own signature, so Python binds the
arguments (no `inspect.signature` per call). A describer never touches tensor data: shapes,
dtypes and device types only. It raises `Unchecked` for calls that cannot be checked (a `recv`
from any source, arguments torch itself will reject): those go to torch as they are.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

__all__ = ["DESCRIBERS", "OBJECT_OPS", "P2P_OPS", "Call", "Core", "Spec", "Unchecked", "spec"]

# (shape, dtype name, device type): a plain tuple, so it marshals into a fingerprint as is
Spec = tuple[tuple[int, ...], str, str]
# (op, inputs, outputs, reduce op, root, peer, in splits, out splits, count, finite, tag)
Core = tuple[Any, ...]

_SUM = dist.ReduceOp.SUM
_dtype_names: dict[torch.dtype, str] = {}
_reduce_names: dict[Any, str] = {}


class Unchecked(Exception):
    """This call goes to torch unchecked (torch raises its own error where the call is bad)."""


class Call:
    """One rank's call, described: what goes into its fingerprint, and how to dispatch it."""

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
        "peer",
        "reduce",
        "reduce_op",
        "root",
        "tag",
    )

    def __init__(
        self,
        op: str,
        group: Any,
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
        self.group = group
        self.inputs = inputs
        self.outputs = outputs
        self.reduce_op = reduce_op
        self.root = root
        self.peer = peer
        self.in_splits = in_splits
        self.out_splits = out_splits
        self.count = count
        self.tag = tag
        self.async_op = async_op
        self.nbytes = nbytes
        # the tensors `check_finite` looks at (reductions only)
        self.reduce = reduce

    def core(self, finite: bool | None) -> Core:
        return (
            self.op,
            self.inputs,
            self.outputs,
            self.reduce_op,
            self.root,
            self.peer,
            self.in_splits,
            self.out_splits,
            self.count,
            finite,
            self.tag,
        )


def spec(t: torch.Tensor) -> Spec:
    name = _dtype_names.get(t.dtype)
    if name is None:
        name = _dtype_names[t.dtype] = str(t.dtype).removeprefix("torch.")
    # `t.device` builds a new object each time; `is_cpu` is 7x cheaper for the common case
    return tuple(t.shape), name, "cpu" if t.is_cpu else t.device.type


def _specs(ts: Sequence[torch.Tensor] | None) -> tuple[Spec, ...]:
    return () if ts is None else tuple(spec(t) for t in ts)


def _reduce_name(op: Any) -> str:
    if op is _SUM:  # hashing a pybind enum costs 0.4 us; SUM is the usual op
        return "SUM"
    try:
        return _reduce_names[op]
    except (KeyError, TypeError):
        pass
    name = str(getattr(op, "name", None) or op).rsplit(".", 1)[-1]
    with contextlib.suppress(TypeError):  # a ReduceOp instance (premul_sum) is not hashable
        _reduce_names[op] = name
    return name


def _global(group: Any, rank: int | None, group_rank: int | None) -> int:
    """A root or peer as a global rank, from either of torch's two ways to name it."""
    if rank is not None:
        if group_rank is not None:
            raise Unchecked("both a global and a group rank")
        return int(rank)
    if group_rank is None:
        raise Unchecked("no rank given")
    if group is None or group is c10d.GroupMember.WORLD:
        return int(group_rank)
    return int(dist.get_global_rank(group, group_rank))


def _splits(sizes: Sequence[int] | None) -> tuple[int, ...] | None:
    return None if sizes is None else tuple(int(s) for s in sizes)


def _nbytes(ts: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


# --- collectives ------------------------------------------------------------------------------


def all_reduce(tensor: Any, op: Any = _SUM, group: Any = None, async_op: bool = False) -> Call:
    return Call(
        "all_reduce",
        group,
        (spec(tensor),),
        reduce_op=_reduce_name(op),
        async_op=async_op,
        nbytes=tensor.nbytes,
        reduce=(tensor,),
    )


def reduce(
    tensor: Any,
    dst: int | None = None,
    op: Any = _SUM,
    group: Any = None,
    async_op: bool = False,
    group_dst: int | None = None,
) -> Call:
    return Call(
        "reduce",
        group,
        (spec(tensor),),
        reduce_op=_reduce_name(op),
        root=_global(group, dst, group_dst),
        async_op=async_op,
        nbytes=tensor.nbytes,
        reduce=(tensor,),
    )


def broadcast(
    tensor: Any,
    src: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_src: int | None = None,
) -> Call:
    return Call(
        "broadcast",
        group,
        (spec(tensor),),
        root=_global(group, src, group_src),
        async_op=async_op,
        nbytes=tensor.nbytes,
    )


def all_gather(tensor_list: Any, tensor: Any, group: Any = None, async_op: bool = False) -> Call:
    return Call(
        "all_gather",
        group,
        (spec(tensor),),
        _specs(tensor_list),
        async_op=async_op,
        nbytes=tensor.nbytes,
    )


def _gather_single(name: str) -> Callable[..., Call]:
    def describe(
        output_tensor: Any, input_tensor: Any, group: Any = None, async_op: bool = False
    ) -> Call:
        return Call(
            name,
            group,
            (spec(input_tensor),),
            (spec(output_tensor),),
            async_op=async_op,
            nbytes=input_tensor.nbytes,
        )

    return describe


def gather(
    tensor: Any,
    gather_list: Any = None,
    dst: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_dst: int | None = None,
) -> Call:
    return Call(
        "gather",
        group,
        (spec(tensor),),
        _specs(gather_list),
        root=_global(group, dst, group_dst),
        async_op=async_op,
        nbytes=tensor.nbytes,
    )


def scatter(
    tensor: Any,
    scatter_list: Any = None,
    src: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_src: int | None = None,
) -> Call:
    return Call(
        "scatter",
        group,
        _specs(scatter_list),
        (spec(tensor),),
        root=_global(group, src, group_src),
        async_op=async_op,
        nbytes=_nbytes(scatter_list or ()),
    )


def reduce_scatter(
    output: Any, input_list: Any, op: Any = _SUM, group: Any = None, async_op: bool = False
) -> Call:
    return Call(
        "reduce_scatter",
        group,
        _specs(input_list),
        (spec(output),),
        reduce_op=_reduce_name(op),
        async_op=async_op,
        nbytes=_nbytes(input_list),
        reduce=tuple(input_list),
    )


def _reduce_scatter_single(name: str) -> Callable[..., Call]:
    def describe(
        output: Any, input: Any, op: Any = _SUM, group: Any = None, async_op: bool = False
    ) -> Call:
        return Call(
            name,
            group,
            (spec(input),),
            (spec(output),),
            reduce_op=_reduce_name(op),
            async_op=async_op,
            nbytes=input.nbytes,
            reduce=(input,),
        )

    return describe


def all_to_all(
    output_tensor_list: Any, input_tensor_list: Any, group: Any = None, async_op: bool = False
) -> Call:
    return Call(
        "all_to_all",
        group,
        _specs(input_tensor_list),
        _specs(output_tensor_list),
        async_op=async_op,
        nbytes=_nbytes(input_tensor_list),
    )


def all_to_all_single(
    output: Any,
    input: Any,
    output_split_sizes: Any = None,
    input_split_sizes: Any = None,
    group: Any = None,
    async_op: bool = False,
) -> Call:
    return Call(
        "all_to_all_single",
        group,
        (spec(input),),
        (spec(output),),
        in_splits=_splits(input_split_sizes),
        out_splits=_splits(output_split_sizes),
        async_op=async_op,
        nbytes=input.nbytes,
    )


def barrier(
    group: Any = None, async_op: bool = False, device_ids: Any = None, timeout: Any = None
) -> Call:
    return Call("barrier", group, async_op=async_op)


def monitored_barrier(group: Any = None, timeout: Any = None, wait_all_ranks: bool = False) -> Call:
    return Call("monitored_barrier", group)


# --- object collectives -----------------------------------------------------------------------


def all_gather_object(object_list: Any, obj: Any, group: Any = None) -> Call:
    return Call("all_gather_object", group, count=len(object_list))


def gather_object(
    obj: Any,
    object_gather_list: Any = None,
    dst: int | None = None,
    group: Any = None,
    group_dst: int | None = None,
) -> Call:
    count = None if object_gather_list is None else len(object_gather_list)
    return Call("gather_object", group, root=_global(group, dst, group_dst), count=count)


def broadcast_object_list(
    object_list: Any,
    src: int | None = None,
    group: Any = None,
    device: Any = None,
    group_src: int | None = None,
) -> Call:
    root = _global(group, src, group_src)
    return Call("broadcast_object_list", group, root=root, count=len(object_list))


def scatter_object_list(
    scatter_object_output_list: Any,
    scatter_object_input_list: Any = None,
    src: int | None = None,
    group: Any = None,
    group_src: int | None = None,
) -> Call:
    root = _global(group, src, group_src)
    given = scatter_object_input_list
    count = None if given is None or dist.get_rank() != root else len(given)
    return Call("scatter_object_list", group, root=root, count=count)


# --- point to point ---------------------------------------------------------------------------


def _p2p_call(name: str, tensor: Any, group: Any, peer: int, tag: int, is_send: bool) -> Call:
    s = (spec(tensor),)
    return Call(
        name,
        group,
        s if is_send else (),
        () if is_send else s,
        peer=peer,
        tag=tag,
        nbytes=tensor.nbytes,
    )


def _send(name: str) -> Callable[..., Call]:
    def describe(
        tensor: Any,
        dst: int | None = None,
        group: Any = None,
        tag: int = 0,
        group_dst: int | None = None,
    ) -> Call:
        return _p2p_call(name, tensor, group, _global(group, dst, group_dst), tag, True)

    return describe


def _recv(name: str) -> Callable[..., Call]:
    def describe(
        tensor: Any,
        src: int | None = None,
        group: Any = None,
        tag: int = 0,
        group_src: int | None = None,
    ) -> Call:
        if src is None and group_src is None:
            raise Unchecked("recv from any source")
        return _p2p_call(name, tensor, group, _global(group, src, group_src), tag, False)

    return describe


DESCRIBERS: dict[str, Callable[..., Call]] = {
    "all_reduce": all_reduce,
    "reduce": reduce,
    "broadcast": broadcast,
    "all_gather": all_gather,
    "all_gather_into_tensor": _gather_single("all_gather_into_tensor"),
    "all_gather_single": _gather_single("all_gather_single"),
    "gather": gather,
    "scatter": scatter,
    "reduce_scatter": reduce_scatter,
    "reduce_scatter_tensor": _reduce_scatter_single("reduce_scatter_tensor"),
    "reduce_scatter_single": _reduce_scatter_single("reduce_scatter_single"),
    "all_to_all": all_to_all,
    "all_to_all_single": all_to_all_single,
    "barrier": barrier,
    "monitored_barrier": monitored_barrier,
    "all_gather_object": all_gather_object,
    "gather_object": gather_object,
    "broadcast_object_list": broadcast_object_list,
    "scatter_object_list": scatter_object_list,
    "send": _send("send"),
    "isend": _send("isend"),
    "recv": _recv("recv"),
    "irecv": _recv("irecv"),
}
P2P_OPS = frozenset({"send", "isend", "recv", "irecv"})
OBJECT_OPS = frozenset(
    {"all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list"}
)
