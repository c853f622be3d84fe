"""What only the Python-level caller knows, added to the op-level check (never a second check).

The ops beneath (`intercept`) see tensors; a few Python functions know more, and say it through
`intercept.local.context` while they run:

- the object collectives: which one the user called and its list length, so that a rank calling
  `broadcast_object_list` while its peer calls `broadcast` is named as such, and list lengths are
  compared as lengths rather than as the shapes of torch's size tensors;
- DDP's constructor: the model's parameter names and shapes, so that models that differ across
  ranks are named by parameter before DDP's own check moves any data; each DDP model is also
  remembered so that its gradient buckets can be named (`origin.ddp_bucket`);
- `batch_isend_irecv`: posts every send before any receive waits (`p2p.batch`), since the ops of a
  batch may come in any order on each rank; a blocking `recv` from any source counts its message
  once the source is known;
- `Work.wait`: the end time of a synchronous op (its event is recorded before the caller waits);
- `ProcessGroup`'s methods, which every `torch.distributed` function calls: checked there when
  called as `torch.distributed` calls them (`methods`), which skips the dispatcher's round trip
  into the ops' kernels;
- under `torch.inference_mode()` the ops' kernels are not reached (`intercept`): the group's
  other methods and the functional collectives (what DTensor calls) then run with inference
  mode off for the call's duration. Tensors they make are normal tensors, which inference-mode
  code uses as it would its own.
"""

from __future__ import annotations

import functools
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import _functional_collectives as funcol
from torch.distributed import distributed_c10d as c10d
from torch.nn.parallel import distributed as ddp_module

from distnb.errors import warned_at_caller
from distnb.rank.checked import methods, origin
from distnb.rank.checked.calls import local, spec
from distnb.rank.checked.intercept import Context
from distnb.rank.checked.recorder import END

__all__ = ["Patches", "using"]

_MODULES = (dist, c10d)
_REBUILT: weakref.WeakSet[Any] = weakref.WeakSet()  # DDP models whose rebuilt buckets are read
Wrap = Callable[[Any], Any]  # a torch function -> its wrapper


@contextmanager
def using(context: Context) -> Iterator[None]:
    outer = local.context
    local.context = context
    try:
        yield
    finally:
        local.context = outer


def _length(lst: Any) -> int | None:
    return None if lst is None else len(lst)


def _group_root(group: Any, root: int | None, group_root: int | None) -> int | None:
    """A root as a group rank (the ops' way), from either of torch's two ways to name it."""
    if group_root is not None or root is None:
        return group_root
    return root if group is None else dist.get_group_rank(group, root)


# What an object collective's arguments say: (the list length, the root as a group rank)
Said = tuple[int | None, int | None]


def _all_gather_object(object_list: Any, obj: Any, group: Any = None) -> Said:
    return _length(object_list), None


def _gather_object(
    obj: Any,
    object_gather_list: Any = None,
    dst: Any = None,
    group: Any = None,
    group_dst: Any = None,
) -> Said:
    return _length(object_gather_list), _group_root(group, dst, group_dst)


def _broadcast_object_list(
    object_list: Any,
    src: Any = None,
    group: Any = None,
    device: Any = None,
    group_src: Any = None,
) -> Said:
    return _length(object_list), _group_root(group, src, group_src)


def _scatter_object_list(
    out: Any, given: Any = None, src: Any = None, group: Any = None, group_src: Any = None
) -> Said:
    root = _group_root(group, src, group_src)
    me = dist.get_rank(group) if group is not None else dist.get_rank()
    # the input list counts only on the root, where torch reads it
    return (_length(given) if root is None or me == root else None), root


OBJECT_CALLS: dict[str, Callable[..., Said]] = {
    "all_gather_object": _all_gather_object,
    "gather_object": _gather_object,
    "broadcast_object_list": _broadcast_object_list,
    "scatter_object_list": _scatter_object_list,
}


# ProcessGroup's collective methods (what `torch.distributed`'s functions call), and the
# functional collectives DTensor and tensor parallel call: checked under inference mode too
_GROUP_METHODS = (
    "allreduce",
    "allreduce_coalesced",
    "broadcast",
    "reduce",
    "allgather",
    "_allgather_base",
    "all_gather_single",
    "allgather_coalesced",
    "allgather_into_tensor_coalesced",
    "gather",
    "scatter",
    "reduce_scatter",
    "_reduce_scatter_base",
    "reduce_scatter_single",
    "reduce_scatter_tensor_coalesced",
    "alltoall",
    "alltoall_base",
    "all_to_all_single",
    "barrier",
    "monitored_barrier",
    "send",
    "recv",
    "recv_anysource",
)
_FUNCTIONAL = (
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather_tensor",
    "all_gather_tensor_autograd",
    "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_autograd",
    "reduce_scatter_tensor_coalesced",
    "all_to_all_single",
    "all_to_all_single_autograd",
    "broadcast",
    "permute_tensor",
)


def _stamp_end(wait: Any) -> Any:
    """`Work.wait`: the end of the synchronous op just made (see `Checker.collective`)."""

    @functools.wraps(wait)
    def stamped(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # IPython leaves this frame out of tracebacks
        result = wait(*args, **kwargs)
        entry = local.unwaited
        if entry is not None:
            local.unwaited = None
            entry[END] = time.monotonic_ns()
        return result

    return stamped


def _awake(fn: Any) -> Any:
    """`fn` with inference mode off while it runs, if it was on (see the module doc)."""

    @functools.wraps(fn)
    def awake(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # IPython leaves this frame out of tracebacks
        # `torch.compile` traces through this (DTensor code calls functional collectives):
        # `is_compiling()` is a constant there, so the graph does not break on the mode check
        if not torch.compiler.is_compiling() and torch.is_inference_mode_enabled():
            with torch.inference_mode(False):
                return fn(*args, **kwargs)
        return fn(*args, **kwargs)

    return awake


class Patches:
    """The Python functions `install` wraps; `restore` puts them back."""

    def __init__(self, *, send: Wrap, recv: Wrap, batch: Wrap, interceptor: Any) -> None:
        self._originals: list[tuple[Any, str, Any]] = []
        for name, said in OBJECT_CALLS.items():
            self._wrap_dist(name, functools.partial(_object_wrapper, name=name, said=said))
        self._wrap_dist("send", send)
        self._wrap_dist("recv", recv)
        self._wrap_dist("batch_isend_irecv", batch)
        for name in _GROUP_METHODS:
            if name in methods.DESCRIBE:  # checked where `torch.distributed` calls them
                make = functools.partial(_entry, name=name, interceptor=interceptor)
                self._patch(dist.ProcessGroup, name, make)
            else:
                self._patch(dist.ProcessGroup, name, _awake)
        for name in _FUNCTIONAL:
            self._patch(funcol, name, _awake)
        self._patch(dist.Work, "wait", _stamp_end)
        self._patch(ddp_module, "_verify_param_shape_across_processes", _verify_wrapper)
        self._patch(ddp_module.DistributedDataParallel, "__init__", _ddp_init_wrapper)
        self._patch(ddp_module.DistributedDataParallel, "forward", _ddp_forward_wrapper)

    def restore(self) -> None:
        for owner, name, original in reversed(self._originals):
            setattr(owner, name, original)
        self._originals.clear()

    def _wrap_dist(self, name: str, make: Callable[[Any], Any]) -> None:
        original = getattr(c10d, name, None)
        if original is None:
            return  # this torch has no such function
        wrapper = make(original)
        for module in _MODULES:
            if getattr(module, name, None) is original:
                self._originals.append((module, name, original))
                setattr(module, name, wrapper)

    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        # A class keeps its raw attribute (a pybind method is an `instancemethod` descriptor
        # there, and only that binds `self`): put back exactly that.
        raw = vars(owner).get(name) if isinstance(owner, type) else getattr(owner, name, None)
        if raw is not None:
            self._originals.append((owner, name, raw))
            setattr(owner, name, make(getattr(owner, name)))


def _entry(method: Any, *, name: str, interceptor: Any) -> Any:
    return methods.entry(name, method, interceptor, _awake(method))


def _object_wrapper(fn: Any, *, name: str, said: Callable[..., Said]) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # IPython leaves this frame out of tracebacks
        try:
            count, root = said(*args, **kwargs)
        except (TypeError, ValueError, RuntimeError):  # torch will reject them: let it say so
            return fn(*args, **kwargs)
        with using(Context(op=name, count=count, root=root)):
            return fn(*args, **kwargs)

    return wrapper


def _verify_wrapper(fn: Any) -> Any:
    @functools.wraps(fn)
    def verify(process_group: Any, tensors: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # IPython leaves this frame out of tracebacks
        model = local.ddp_model
        module = getattr(model, "module", None)
        names = {id(p): n for n, p in module.named_parameters()} if module is not None else {}
        params = tuple(
            (names.get(id(t), f"parameters[{i}]"), spec(t)) for i, t in enumerate(tensors)
        )
        with using(Context(params=params)):
            return fn(process_group, tensors, *args, **kwargs)

    return verify


def _ddp_init_wrapper(init: Any) -> Any:
    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        __tracebackhide__ = True  # IPython leaves this frame out of tracebacks
        outer = local.ddp_model
        local.ddp_model = self
        try:
            warned_at_caller(init, self, *args, **kwargs)
        finally:
            local.ddp_model = outer
        origin.remember_buckets(self)

    return __init__


def _ddp_forward_wrapper(forward: Any) -> Any:
    """DDP rebuilds its buckets at the start of its second forward: read them again then. The
    model forwarded last is the one whose buckets the next backward reduces."""

    @functools.wraps(forward)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # IPython leaves this frame out of tracebacks
        out = forward(self, *args, **kwargs)
        if getattr(self, "_has_rebuilt_buckets", False) and self not in _REBUILT:
            _REBUILT.add(self)
            origin.remember_buckets(self)
        else:
            origin.forwarded(self)
        return out

    return wrapper
