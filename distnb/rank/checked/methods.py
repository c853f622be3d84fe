"""The Python-level entry to the check: `ProcessGroup`'s methods, as `torch.distributed` calls them.

Every `torch.distributed` collective ends in a method of its group, with an options object
(`group.allreduce([tensor], opts)`). Those methods are wrapped (`entry`): the call is described
from its Python arguments, checked by the same `Checker.collective` as the ops' kernels
(`intercept`), and run below the `ADInplaceOrView` key, where the kernels sit, so that the
dispatcher does not carry the call into Python a second time. Each call is checked once, here or
there: other callers (DDP's reducer, functional collectives, compiled graphs) reach the kernels,
and so do the methods' other overloads, which `DESCRIBE` does not read.

Why a second entry: the trip from the dispatcher into a Python kernel and back (boxing the
arguments, a `ScriptObject` for the group and for the reduce op, and `ReduceOp.op()`, a
TorchScript method) costs more than the check itself on small collectives: checked 8-element
collectives on 2 gloo ranks took 8-18% less time per call here than through the kernels
(`docs/performance.md`).

Running below `ADInplaceOrView` (`torch._C._AutoDispatchBelowADInplaceOrView`, what the kernels'
redispatch does too) changes nothing else for these ops: torch registers no kernel of its own
there for them, none bumps a version counter, and code under `torch.inference_mode()` is checked
here as anywhere (the kernels need it switched off, `context`).

The methods' other overloads (`group.allreduce(t, op)`) are described by the kernels. Torch 2.8
and 2.9 give the kernels the reduce op boxed, unreadable (`ops.READS_REDUCE_OP`): there the op
goes with the call as context, as the Python caller passed it, so that one rank's
`dist.all_reduce` and its peer's `group.allreduce(t)` compare two ops, not an op with `UNKNOWN`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from distnb.rank.checked import ops
from distnb.rank.checked.calls import Call, local, reduce_name
from distnb.rank.checked.intercept import Context

__all__ = ["DESCRIBE", "entry"]

_BELOW = torch._C._AutoDispatchBelowADInplaceOrView
_T = torch.Tensor


def _op(opts: Any) -> int:
    return int(opts.reduceOp.op)  # a RedOpType, what `calls.reduce_name` reads


# Each describer takes the method's arguments in the form `torch.distributed` passes them and
# says what the op beneath will do, through that op's describer (`ops`).


def _allreduce(pg: Any, ts: list[_T], opts: Any) -> Call:
    return ops.allreduce_(ts, pg, _op(opts), None, opts.asyncOp)


def _allreduce_coalesced(pg: Any, ts: list[_T], opts: Any) -> Call:
    return ops.allreduce_coalesced_(ts, pg, _op(opts), opts.asyncOp)


def _broadcast(pg: Any, ts: list[_T], opts: Any) -> Call:
    return ops.broadcast_(ts, pg, opts.rootRank, opts.rootTensor, opts.asyncOp)


def _reduce(pg: Any, ts: list[_T], opts: Any) -> Call:
    return ops.reduce_(ts, pg, _op(opts), opts.rootRank, opts.rootTensor, opts.asyncOp)


def _allgather(pg: Any, outs: list[list[_T]], ins: list[_T], opts: Any) -> Call:
    return ops.allgather_(outs, ins, pg, opts.asyncOp)


def _all_gather_single(pg: Any, out: _T, inp: _T, opts: Any) -> Call:
    return ops._allgather_base_(out, inp, pg, opts.asyncOp)


def _allgather_coalesced(pg: Any, outs: list[list[_T]], ins: list[_T], opts: Any) -> Call:
    return ops.allgather_coalesced_(outs, ins, pg, opts.asyncOp)


def _gather(pg: Any, outs: list[list[_T]], ins: list[_T], opts: Any) -> Call:
    return ops.gather_(outs, ins, pg, opts.rootRank, opts.asyncOp)


def _scatter(pg: Any, outs: list[_T], ins: list[list[_T]], opts: Any) -> Call:
    return ops.scatter_(outs, ins, pg, opts.rootRank, opts.asyncOp)


def _reduce_scatter(pg: Any, outs: list[_T], ins: list[list[_T]], opts: Any) -> Call:
    return ops.reduce_scatter_(outs, ins, pg, _op(opts), opts.asyncOp)


def _reduce_scatter_single(pg: Any, out: _T, inp: _T, opts: Any) -> Call:
    return ops._reduce_scatter_base_(out, inp, pg, _op(opts), opts.asyncOp)


def _all_to_all_single(
    pg: Any, out: _T, inp: _T, out_splits: list[int], in_splits: list[int], opts: Any
) -> Call:
    return ops.alltoall_base_(out, inp, pg, out_splits, in_splits, opts.asyncOp)


def _alltoall(pg: Any, outs: list[_T], ins: list[_T], opts: Any) -> Call:
    return ops.alltoall_(outs, ins, pg, opts.asyncOp)


def _barrier(pg: Any, *, opts: Any) -> Call:
    return ops.barrier(None, pg, opts.device_ids, opts.asyncOp)  # type: ignore[arg-type]


DESCRIBE: dict[str, Callable[..., Call]] = {
    "allreduce": _allreduce,
    "allreduce_coalesced": _allreduce_coalesced,
    "broadcast": _broadcast,
    "reduce": _reduce,
    "allgather": _allgather,
    "all_gather_single": _all_gather_single,
    "allgather_coalesced": _allgather_coalesced,
    "gather": _gather,
    "scatter": _scatter,
    "reduce_scatter": _reduce_scatter,
    "reduce_scatter_single": _reduce_scatter_single,
    "all_to_all_single": _all_to_all_single,
    "alltoall": _alltoall,
    "barrier": _barrier,
    # the names torch before 2.13 gives the same methods (its `torch.distributed` calls these)
    "_allgather_base": _all_gather_single,
    "_reduce_scatter_base": _reduce_scatter_single,
    "alltoall_base": _all_to_all_single,
}

# the methods that reduce: each of their overloads reduces with SUM unless told otherwise
_REDUCING = frozenset(
    {
        "allreduce",
        "allreduce_coalesced",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_single",
        "_reduce_scatter_base",
        "reduce_scatter_tensor_coalesced",
    }
)

Check = Callable[[Call, Callable[[], Any]], Any]


def entry(name: str, method: Any, interceptor: Any, fallback: Any) -> Any:
    """`ProcessGroup.<name>`, checked here when its arguments are in `torch.distributed`'s form;
    `fallback` (the method as the kernels should see it) otherwise. `interceptor` holds the check
    and the `unchecked()` count (`intercept.Interceptor`)."""
    describe = DESCRIBE[name]

    @functools.wraps(method)
    def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # IPython leaves this frame out of tracebacks
        if interceptor.refusal is not None and not torch.compiler.is_compiling():
            raise interceptor.refusal
        check: Check | None = interceptor.check
        # `torch.compile` traces through this: `is_compiling()` is a constant there
        if check is None or torch.compiler.is_compiling() or local.depth:
            return fallback(self, *args, **kwargs)
        if interceptor.paused:
            with _BELOW():
                return method(self, *args, **kwargs)
        try:
            call = describe(self, *args, **kwargs)
        except Exception:  # another overload, or arguments torch will reject: the kernels see it
            return _to_kernels(name, fallback, self, args, kwargs)
        context = local.context
        if context is not None:
            context.apply(call)

        def dispatch() -> Any:
            __tracebackhide__ = True
            with _BELOW():
                return method(self, *args, **kwargs)

        return check(call, dispatch)

    return checked


def _to_kernels(
    name: str, fallback: Any, pg: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """`fallback(pg, ...)`, described by the kernels; where they cannot read a reduce op, with
    the one the arguments name as context (see the module doc)."""
    if ops.READS_REDUCE_OP or name not in _REDUCING or local.context is not None:
        return fallback(pg, *args, **kwargs)
    local.context = Context(reduce_op=_said_reduce_op((*args, *kwargs.values())))
    try:
        return fallback(pg, *args, **kwargs)
    finally:
        local.context = None


def _said_reduce_op(args: tuple[Any, ...]) -> str:
    for arg in args:
        if isinstance(arg, (dist.ReduceOp, dist.ReduceOp.RedOpType)):
            return reduce_name(arg)
        if hasattr(arg, "reduceOp"):  # an options object
            return reduce_name(_op(arg))
    return "SUM"
