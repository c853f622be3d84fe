"""What each collective op is about to do, read from its arguments as the dispatcher passes them.

Every path to a process group ends in one of these ops: the `c10d::*` ops (which
`torch.distributed`'s functions, DDP's constructor and reducer, FSDP2 and pipelining reach
through `ProcessGroup`), and the functional `_c10d_functional::*` ops (DTensor, tensor parallel,
`torch.compile`d graphs). One describer per op, with the op's own schema as its signature, so
Python binds the arguments. A describer reads shapes, dtypes and device types, never data; roots
and peers stay group ranks (the checker makes them global).

`OPS` maps `namespace::name` to (canonical op, describer). Canonical names are the ones the
matching rules know (`all_gather_single` for `_allgather_base_` and the functional
`all_gather_into_tensor` alike), so two paths to the same collective compare as one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from distnb.rank.checked import funcol
from distnb.rank.checked.calls import (
    Call,
    group_name,
    nbytes,
    reduce_name,
    spec,
    specs,
    splits,
)

__all__ = ["OPS", "P2P_OPS", "READS_REDUCE_OP", "UNREAD", "Describe"]

Describe = Callable[..., Call]
_T = torch.Tensor


def _one(name: str, ts: Sequence[_T], pg: Any, **kw: Any) -> Call:
    return Call(name, group_name(pg), specs(ts), nbytes=nbytes(ts), **kw)


# Torch 2.8 and 2.9 box a ReduceOp with nothing Python can read (no `op()` method, no properties;
# 2.10 added `op()`): calls that reach these ops from C++ (DDP's gradient buckets) are compared
# there without their reduce op. Python callers say theirs (`methods`).
READS_REDUCE_OP: bool = torch.classes.c10d.ReduceOp()._has_method("op")
UNREAD = "UNKNOWN"  # what `calls.reduce_name` says of a reduce op it cannot name


def _unread_or_name(op: Any) -> str:
    return UNREAD if isinstance(op, torch.ScriptObject) else reduce_name(op)


_reduce = reduce_name if READS_REDUCE_OP else _unread_or_name  # one call either way


# --- c10d::* (ProcessGroup) -------------------------------------------------------------------


def allreduce_(
    ts: list[_T], pg: Any, op: Any, sparse: Any = None, async_op: bool = True, timeout: int = -1
) -> Call:
    return _one("all_reduce", ts, pg, reduce_op=_reduce(op), async_op=async_op, reduce=tuple(ts))


def allreduce_coalesced_(
    ts: list[_T], pg: Any, op: Any, async_op: bool = True, timeout: int = -1
) -> Call:
    name = "all_reduce_coalesced"
    return _one(name, ts, pg, reduce_op=_reduce(op), async_op=async_op, reduce=tuple(ts))


def broadcast_(
    ts: list[_T], pg: Any, root: int, root_tensor: int = 0, async_op: bool = True, timeout: int = -1
) -> Call:
    return _one("broadcast", ts, pg, root=root, async_op=async_op)


def reduce_(
    ts: list[_T],
    pg: Any,
    op: Any,
    root: int,
    root_tensor: int = 0,
    async_op: bool = True,
    timeout: int = -1,
) -> Call:
    name = "reduce"
    return _one(name, ts, pg, reduce_op=_reduce(op), root=root, async_op=async_op, reduce=tuple(ts))


def allgather_(
    outs: list[list[_T]], ins: list[_T], pg: Any, async_op: bool = True, timeout: int = -1
) -> Call:
    return Call(
        "all_gather",
        group_name(pg),
        specs(ins),
        specs(outs[0] if outs else ()),
        async_op=async_op,
        nbytes=nbytes(ins),
    )


def _allgather_base_(out: _T, inp: _T, pg: Any, async_op: bool = True, timeout: int = -1) -> Call:
    return Call(
        "all_gather_single",
        group_name(pg),
        (spec(inp),),
        (spec(out),),
        async_op=async_op,
        nbytes=inp.nbytes,
    )


def allgather_coalesced_(
    outs: list[list[_T]], ins: list[_T], pg: Any, async_op: bool = True
) -> Call:
    flat = [t for lst in outs for t in lst]
    return Call(
        "all_gather_coalesced",
        group_name(pg),
        specs(ins),
        specs(flat),
        async_op=async_op,
        nbytes=nbytes(ins),
    )


def allgather_into_tensor_coalesced_(
    outs: list[_T], ins: list[_T], pg: Any, async_op: bool = True
) -> Call:
    return Call(
        "all_gather_single_coalesced",
        group_name(pg),
        specs(ins),
        specs(outs),
        async_op=async_op,
        nbytes=nbytes(ins),
    )


def reduce_scatter_(
    outs: list[_T], ins: list[list[_T]], pg: Any, op: Any, async_op: bool = True, timeout: int = -1
) -> Call:
    inputs = list(ins[0]) if ins else []
    return Call(
        "reduce_scatter",
        group_name(pg),
        specs(inputs),
        specs(outs),
        reduce_op=_reduce(op),
        async_op=async_op,
        nbytes=nbytes(inputs),
        reduce=tuple(inputs),
    )


def _reduce_scatter_base_(
    out: _T, inp: _T, pg: Any, op: Any, async_op: bool = True, timeout: int = -1
) -> Call:
    return Call(
        "reduce_scatter_single",
        group_name(pg),
        (spec(inp),),
        (spec(out),),
        reduce_op=_reduce(op),
        async_op=async_op,
        nbytes=inp.nbytes,
        reduce=(inp,),
    )


def reduce_scatter_tensor_coalesced_(
    outs: list[_T], ins: list[_T], pg: Any, op: Any, async_op: bool = True, timeout: int = -1
) -> Call:
    return Call(
        "reduce_scatter_single_coalesced",
        group_name(pg),
        specs(ins),
        specs(outs),
        reduce_op=_reduce(op),
        async_op=async_op,
        nbytes=nbytes(ins),
        reduce=tuple(ins),
    )


def alltoall_(
    outs: list[_T], ins: list[_T], pg: Any, async_op: bool = True, timeout: int = -1
) -> Call:
    return Call(
        "all_to_all", group_name(pg), specs(ins), specs(outs), async_op=async_op, nbytes=nbytes(ins)
    )


def alltoall_base_(
    out: _T,
    inp: _T,
    pg: Any,
    out_splits: list[int],
    in_splits: list[int],
    async_op: bool = True,
    timeout: int = -1,
) -> Call:
    return Call(
        "all_to_all_single",
        group_name(pg),
        (spec(inp),),
        (spec(out),),
        in_splits=splits(in_splits),
        out_splits=splits(out_splits),
        async_op=async_op,
        nbytes=inp.nbytes,
    )


def gather_(
    outs: list[list[_T]],
    ins: list[_T],
    pg: Any,
    root: int,
    async_op: bool = True,
    timeout: int = -1,
) -> Call:
    return Call(
        "gather",
        group_name(pg),
        specs(ins),
        specs(outs[0] if outs else ()),
        root=root,
        async_op=async_op,
        nbytes=nbytes(ins),
    )


def scatter_(
    outs: list[_T],
    ins: list[list[_T]],
    pg: Any,
    root: int,
    async_op: bool = True,
    timeout: int = -1,
) -> Call:
    inputs = list(ins[0]) if ins else []
    return Call(
        "scatter",
        group_name(pg),
        specs(inputs),
        specs(outs),
        root=root,
        async_op=async_op,
        nbytes=nbytes(inputs),
    )


def barrier(
    t: _T, pg: Any, device_ids: list[int], async_op: bool = True, timeout: int = -1
) -> Call:
    return Call("barrier", group_name(pg), async_op=async_op)


def monitored_barrier_(
    t: _T, pg: Any, device_ids: list[int], timeout: int, wait_all_ranks: bool
) -> Call:
    return Call("monitored_barrier", group_name(pg))


def send(ts: list[_T], pg: Any, dst: int, tag: int) -> Call:
    return Call(
        "send", group_name(pg), specs(ts), peer=dst, tag=tag, nbytes=nbytes(ts), async_op=True
    )


def recv_(ts: list[_T], pg: Any, src: int, tag: int) -> Call:
    return Call(
        "recv", group_name(pg), (), specs(ts), peer=src, tag=tag, nbytes=nbytes(ts), async_op=True
    )


def recv_any_source_(ts: list[_T], pg: Any, tag: int) -> Call:
    """Unchecked (the sender is known only afterwards); see `p2p` for how it is counted."""
    return Call("recv_any", group_name(pg), (), specs(ts), tag=tag, nbytes=nbytes(ts))


OPS: dict[str, Describe] = {
    "c10d::allreduce_": allreduce_,
    "c10d::allreduce_coalesced_": allreduce_coalesced_,
    "c10d::broadcast_": broadcast_,
    "c10d::reduce_": reduce_,
    "c10d::allgather_": allgather_,
    "c10d::_allgather_base_": _allgather_base_,
    "c10d::allgather_coalesced_": allgather_coalesced_,
    "c10d::allgather_into_tensor_coalesced_": allgather_into_tensor_coalesced_,
    "c10d::reduce_scatter_": reduce_scatter_,
    "c10d::_reduce_scatter_base_": _reduce_scatter_base_,
    "c10d::reduce_scatter_tensor_coalesced_": reduce_scatter_tensor_coalesced_,
    "c10d::alltoall_": alltoall_,
    "c10d::alltoall_base_": alltoall_base_,
    "c10d::gather_": gather_,
    "c10d::scatter_": scatter_,
    "c10d::barrier": barrier,
    "c10d::monitored_barrier_": monitored_barrier_,
    "c10d::send": send,
    "c10d::recv_": recv_,
    "c10d::recv_any_source_": recv_any_source_,
    "_c10d_functional::all_reduce": funcol.all_reduce,
    "_c10d_functional::all_reduce_": funcol.all_reduce,
    "_c10d_functional::all_reduce_coalesced": funcol.all_reduce_coalesced,
    "_c10d_functional::all_reduce_coalesced_": funcol.all_reduce_coalesced,
    "_c10d_functional::all_gather_into_tensor": funcol.all_gather,
    "_c10d_functional::all_gather_into_tensor_out": funcol.all_gather,
    "_c10d_functional::all_gather_into_tensor_coalesced": funcol.all_gather_coalesced,
    "_c10d_functional::reduce_scatter_tensor": funcol.reduce_scatter,
    "_c10d_functional::reduce_scatter_tensor_out": funcol.reduce_scatter,
    "_c10d_functional::reduce_scatter_tensor_coalesced": funcol.reduce_scatter_coalesced,
    "_c10d_functional::all_to_all_single": funcol.all_to_all_single,
    "_c10d_functional::broadcast": funcol.broadcast,
    "_c10d_functional::broadcast_": funcol.broadcast,
    "_c10d_functional::isend": funcol.isend,
    "_c10d_functional::irecv": funcol.irecv,
}
P2P_OPS = frozenset({"send", "recv", "recv_any"})
