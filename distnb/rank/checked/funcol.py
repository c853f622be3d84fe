"""Describers of the functional collectives, `_c10d_functional::*`: what DTensor, tensor
parallel, FSDP2's functional paths and `torch.compile`d graphs call. They take the group by its
registered name and return new tensors (or write `out=`); see `ops` for the rest.
"""

from __future__ import annotations

from typing import Any

import torch

from distnb.rank.checked.calls import Call, nbytes, reduce_name, spec, specs, splits

_T = torch.Tensor


def all_reduce(inp: _T, op: str, group: str) -> Call:
    return Call(
        "all_reduce",
        group,
        (spec(inp),),
        reduce_op=reduce_name(op),
        nbytes=inp.nbytes,
        async_op=True,
        reduce=(inp,),
    )


def all_reduce_coalesced(ins: list[_T], op: str, group: str) -> Call:
    return Call(
        "all_reduce_coalesced",
        group,
        specs(ins),
        reduce_op=reduce_name(op),
        nbytes=nbytes(ins),
        async_op=True,
        reduce=tuple(ins),
    )


def all_gather(inp: _T, size: int, group: str, *, out: _T | None = None) -> Call:
    return Call(
        "all_gather_single",
        group,
        (spec(inp),),
        (_stacked(inp, size),),
        nbytes=inp.nbytes,
        async_op=True,
    )


def all_gather_coalesced(ins: list[_T], size: int, group: str) -> Call:
    outs = tuple(_stacked(t, size) for t in ins)
    return Call(
        "all_gather_single_coalesced", group, specs(ins), outs, nbytes=nbytes(ins), async_op=True
    )


def reduce_scatter(inp: _T, op: str, size: int, group: str, *, out: _T | None = None) -> Call:
    return Call(
        "reduce_scatter_single",
        group,
        (spec(inp),),
        (_split(inp, size),),
        reduce_op=reduce_name(op),
        nbytes=inp.nbytes,
        async_op=True,
        reduce=(inp,),
    )


def reduce_scatter_coalesced(ins: list[_T], op: str, size: int, group: str) -> Call:
    outs = tuple(_split(t, size) for t in ins)
    return Call(
        "reduce_scatter_single_coalesced",
        group,
        specs(ins),
        outs,
        reduce_op=reduce_name(op),
        nbytes=nbytes(ins),
        async_op=True,
        reduce=tuple(ins),
    )


def all_to_all_single(inp: _T, out_splits: list[int], in_splits: list[int], group: str) -> Call:
    rows = sum(int(s) for s in out_splits) if out_splits else inp.shape[0]
    out = ((rows, *inp.shape[1:]), *spec(inp)[1:])
    return Call(
        "all_to_all_single",
        group,
        (spec(inp),),
        (out,),
        in_splits=splits(in_splits),
        out_splits=splits(out_splits),
        nbytes=inp.nbytes,
        async_op=True,
    )


def broadcast(inp: _T, src: int, group: str) -> Call:
    return Call("broadcast", group, (spec(inp),), root=src, nbytes=inp.nbytes, async_op=True)


def isend(t: _T, dst: int, tag: int, group: str) -> Call:
    return Call("send", group, (spec(t),), peer=dst, tag=tag, nbytes=t.nbytes, async_op=True)


def irecv(t: _T, src: int, tag: int, group: str) -> Call:
    return Call("recv", group, (), (spec(t),), peer=src, tag=tag, nbytes=t.nbytes, async_op=True)


def _stacked(t: _T, size: int) -> Any:
    """The spec of `size` copies of `t` along dim 0 (what all_gather_into_tensor returns)."""
    shape, dtype, device = spec(t)
    first = shape[0] * size if shape else size
    return ((first, *shape[1:]), dtype, device)


def _split(t: _T, size: int) -> Any:
    """The spec of `t`'s dim 0 split `size` ways (what reduce_scatter_tensor returns)."""
    shape, dtype, device = spec(t)
    first = shape[0] // size if shape and size else 0
    return ((first, *shape[1:]), dtype, device)
