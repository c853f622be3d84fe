"""Checking at the process group, beneath every caller: kernels for the collective ops.

Every way to a process group ends in a dispatcher op (`ops.OPS`): `torch.distributed`'s
functions and DDP's, FSDP2's and pipelining's C++ reach `c10d::*` through `ProcessGroup`;
DTensor, tensor parallel and compiled graphs call `_c10d_functional::*`. `install` registers a
Python kernel for each op at the `ADInplaceOrView` dispatch key; each kernel describes the call,
has the checker compare it with its peers', and then redispatches to the backend's own kernel.
`uninstall` removes the kernels.

Why `ADInplaceOrView` (the experiments behind it: docs/architecture.md, "Where collectives
come from"):

- every path above reaches it: `dist.*`, DDP's constructor and its reducer (from the autograd
  engine), FSDP2, DTensor (explicit and implicit redistribution), eager and inductor-compiled
  functional collectives, and tensors made under `inference_mode` used outside it;
- the backend keys (CPU, CUDA) see those paths too, but a Python kernel there must call the
  original kernel with `SafeKernelFunction.call_boxed`, which holds the GIL while gloo takes its
  work queue's lock; gloo's worker thread, which holds that lock while it drops its last
  reference to a finished work's tensors, needs the GIL to release their Python objects, and
  the two deadlock. `redispatch` from this key releases the GIL, as torch's own bindings do;
- code under `torch.inference_mode()` excludes this key: `context` lets the Python-level calls
  made there (`torch.distributed`'s functions, functional collectives) run with inference mode
  off for the call's duration, so they are checked too. C++ callers under inference mode (DDP's
  buffer broadcast in an inference-mode forward) and compiled graphs run there are not checked.

Each op is registered only where the installed torch has it, with a schema its describer reads
(`resolve`): torch adds ops across releases (2.8 and 2.9 have no `_c10d_functional::isend`,
`irecv` or `reduce_scatter_tensor_out`; 2.10 and 2.11 no `isend` or `irecv`), and a missing name
must leave that op unchecked, never stop the install. `Interceptor.missing` names what was left
out; `distnb doctor` says it too.

Traced calls are never checked: `torch.compile` and other tracers run these ops on fake
tensors, and ranks need not trace alike (one may hit a compile cache). Ops called while a
checked op runs (a functional collective calls `c10d::*` in turn) pass straight through:
`local.depth` counts checked calls on each thread.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

from distnb.rank.checked.calls import Call, local
from distnb.rank.checked.ops import OPS, P2P_OPS, UNREAD, Describe

__all__ = ["KEY", "Context", "Interceptor", "resolve"]

KEY = "ADInplaceOrView"
_BELOW = torch._C._after_ADInplaceOrView_keyset
_PYTHON = torch._C.DispatchKey.Python


class Context:
    """What a Python-level caller knows and the op does not (see `context`): the function the
    user called (`broadcast_object_list`), its list length and root, a DDP model's parameters,
    and the reduce op where torch boxes it unreadably (`ops.READS_REDUCE_OP`)."""

    __slots__ = ("count", "op", "params", "reduce_op", "root")

    def __init__(
        self,
        op: str | None = None,
        count: int | None = None,
        root: int | None = None,
        params: tuple[Any, ...] = (),
        reduce_op: str | None = None,
    ) -> None:
        self.op = op
        self.count = count
        self.root = root  # a group rank
        self.params = params
        self.reduce_op = reduce_op

    def apply(self, call: Call) -> None:
        if self.op is not None:
            call.op = self.op
            call.count = self.count
            call.root = self.root
        if self.params:
            call.params = self.params
            self.params = ()  # the first op of the call carries them
        if self.reduce_op is not None and call.reduce_op == UNREAD:
            call.reduce_op = self.reduce_op


# check(call, dispatch) runs the real op through `dispatch()` once the call has been checked
Check = Callable[[Call, Callable[[], Any]], Any]


class Interceptor:
    """The registered kernels. `check` is None while nothing should be checked; `paused` counts
    the `unchecked()` blocks open on any thread (DDP's reducer on CUDA runs in autograd's);
    `refusal`, while set, is what every collective raises (`installation.refused`)."""

    def __init__(self, ops: Mapping[str, Describe] = OPS) -> None:
        self.check: Check | None = None
        self.p2p: Check | None = None
        self.paused = 0
        self.refusal: Exception | None = None  # raised by every collective while set
        self.ops = ops
        self.missing: tuple[str, ...] = ()  # what this torch lacks (see `resolve`)
        self._libraries: dict[str, torch.library.Library] = {}

    def install(self, check: Check, p2p: Check) -> None:
        self.check, self.p2p = check, p2p
        if self._libraries:
            return
        missing = []
        for qualname, describe in self.ops.items():
            op = resolve(qualname, describe)
            if op is None:
                missing.append(qualname)
                continue
            namespace, name = qualname.split("::")
            library = self._libraries.get(namespace)
            if library is None:
                library = self._libraries[namespace] = torch.library.Library(namespace, "IMPL")
            with warnings.catch_warnings():
                # "Overriding a previously registered kernel": the key's default passes through
                warnings.simplefilter("ignore", UserWarning)
                library.impl(name, self._kernel(describe, op), KEY, with_keyset=True)
        self.missing = tuple(missing)

    def uninstall(self) -> None:
        self.check = self.p2p = None
        for library in self._libraries.values():
            library._destroy()
        self._libraries.clear()

    def _kernel(self, describe: Describe, op: Any) -> Callable[..., Any]:
        def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True  # IPython leaves this frame out of tracebacks
            below = keyset & _BELOW
            if self.refusal is not None and not _traced(args):
                raise self.refusal
            check = self.check
            if check is None or self.paused or local.depth or _traced(args):
                return op.redispatch(below, *args, **kwargs)

            def dispatch() -> Any:
                __tracebackhide__ = True  # IPython leaves this frame out of tracebacks
                local.depth += 1
                try:
                    return op.redispatch(below, *args, **kwargs)
                finally:
                    local.depth -= 1

            try:
                call = describe(*args, **kwargs)
            except Exception:  # arguments torch will reject: it says so
                return dispatch()
            context = local.context
            if context is not None:
                context.apply(call)
            if call.op in P2P_OPS:
                assert self.p2p is not None
                return self.p2p(call, dispatch)
            return check(call, dispatch)

        return kernel


def resolve(qualname: str, describe: Describe) -> Any:
    """The op `namespace::name` of the installed torch, or None where it has no such op or its
    schema is not one `describe` can read (a release that added or renamed an argument): a
    kernel that could not describe its calls would pass them all unchecked, unannounced."""
    namespace, name = qualname.split("::")
    try:
        op = getattr(getattr(torch.ops, namespace), name).default
    except (AttributeError, RuntimeError):  # no such op, or no default overload
        return None
    arguments = op._schema.arguments
    positional = [None] * sum(1 for a in arguments if not a.kwarg_only)
    keywords = {a.name: None for a in arguments if a.kwarg_only}
    try:
        inspect.signature(describe).bind(*positional, **keywords)
    except TypeError:
        return None
    return op


def _traced(args: tuple[Any, ...]) -> bool:
    """Fake or functional tensors (Python subclasses) mean a trace, not a real call."""
    first: Any = args[0] if args else None
    while isinstance(first, (list, tuple)):
        first = first[0] if first else None
    if type(first) is torch.Tensor:  # the usual case, answered without asking the dispatcher
        return False
    return isinstance(first, torch.Tensor) and torch._C._dispatch_keys(first).has(_PYTHON)
