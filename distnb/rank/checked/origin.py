"""Where a collective comes from when the user did not call `torch.distributed` themselves.

DDP's constructor and reducer, FSDP2, DTensor and compiled graphs reach a process group on the
user's behalf; a report that says only "all_reduce #12 at `loss.backward()`" leaves the user to
guess. The **origin** names the library code the call came through: "DDP constructor: parameter
shapes", "FSDP2 all-gather for layers.0", "DTensor redistribute S(0) -> R", "compiled graph",
"DDP gradient bucket 0 (fc.bias, fc.weight)". The frameworks' functions (Lightning's, Fabric's,
Accelerate's) are named the same way (`frameworks`).

It is read off the same frame walk that finds the call site (`callsite.lookup`): the innermost
frame between the collective and the user's code whose function is in `RULES` names the origin.
Rules are looked up once per code object. DDP's reducer runs from C++ inside the autograd engine,
so its calls show up as "backward"; the checker numbers them (buckets are reduced in index order)
and `ddp_bucket` names each bucket's parameters, as `remember_buckets` read them from the DDP
models that `context` keeps track of.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch

from distnb.rank.checked.calls import group_name

__all__ = [
    "BACKWARD",
    "COMPILED",
    "Package",
    "Rule",
    "ddp_bucket",
    "forwarded",
    "remember_buckets",
    "rule_for",
]

BACKWARD = "backward"
COMPILED = "compiled graph"
_TORCH = os.path.dirname(os.path.abspath(torch.__file__ or "")) + os.sep
_WORLD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "world.py")

Describe = Callable[[FrameType], str]


class Package:
    """A whole package's label: used only when no function's own rule names the origin."""

    __slots__ = ("label",)

    def __init__(self, label: str) -> None:
        self.label = label


Rule = str | Describe | Package

# The DDP models of this process (see `context`), by id, the one whose forward ran last at the end:
# a backward reduces the buckets of the model it follows, not of an older one still alive on the
# same group. With each, the parameter names in each of its buckets.
_models: dict[int, tuple[weakref.ref[Any], list[list[str]]]] = {}


def _fqn(frame: FrameType) -> str:
    group = frame.f_locals.get("self")
    return str(getattr(group, "_module_fqn", None) or "the root module")


def _placements(spec: Any) -> str:
    names = {"Shard": "S", "Replicate": "R", "Partial": "P"}
    out = []
    for p in getattr(spec, "placements", ()):
        kind = names.get(type(p).__name__, type(p).__name__)
        dim = getattr(p, "dim", None)
        out.append(f"{kind}({dim})" if dim is not None else kind)
    return ",".join(out) or "?"


def _redistribute(frame: FrameType) -> str:
    local = frame.f_locals
    src, dst = _placements(local.get("current_spec")), _placements(local.get("target_spec"))
    return f"DTensor redistribute {src} -> {dst}"


# (file under torch/, function) -> the origin's text, or a function of the frame that makes it
RULES: dict[tuple[str, str], str | Describe] = {
    ("distributed/utils.py", "_verify_param_shape_across_processes"): (
        "DDP constructor: parameter shapes"
    ),
    ("distributed/utils.py", "_sync_module_states"): "DDP: parameters and buffers from rank 0",
    ("nn/parallel/distributed.py", "_sync_buffers"): "DDP: buffers from rank 0",
    ("nn/parallel/distributed.py", "_sync_params_and_buffers"): "DDP: parameters from rank 0",
    # the second forward's bucket rebuild: rank 0's bucket order, from C++
    ("nn/parallel/distributed.py", "_pre_forward"): "DDP: bucket order from rank 0",
    ("distributed/fsdp/_fully_shard/_fsdp_param_group.py", "unshard"): (
        lambda f: f"FSDP2 all-gather for {_fqn(f)!r}"
    ),
    ("distributed/fsdp/_fully_shard/_fsdp_param_group.py", "post_backward"): (
        lambda f: f"FSDP2 reduce-scatter for {_fqn(f)!r}"
    ),
    ("distributed/tensor/_redistribute.py", "redistribute_local_tensor"): _redistribute,
    ("nn/modules/_functions.py", "forward"): "SyncBatchNorm forward",
    ("nn/modules/_functions.py", "backward"): "SyncBatchNorm backward",
    ("autograd/graph.py", "_engine_run_backward"): BACKWARD,
}
# Whole packages, for calls no rule above names.
PACKAGES = (
    ("distributed/pipelining/", Package("pipeline schedule")),
    ("distributed/tensor/parallel/", Package("tensor parallel")),
    ("distributed/fsdp/", Package("FSDP")),
    ("distributed/tensor/", Package("DTensor")),
    ("distributed/checkpoint/", Package("distributed checkpoint")),
)


def rule_for(path: str, function: str) -> Rule | None:
    """The origin rule of a function in torch (`path` absolute), or None. (Code a compiled
    graph runs is generated, not torch's: `graphs.is_generated` tells it, `COMPILED` names it.)
    distnb's stand-in for `destroy_process_group` passes a barrier the user never wrote: it is
    named by the function the user called."""
    if path == _WORLD and function == "destroy_process_group":
        return "destroy_process_group"
    if not path.startswith(_TORCH):
        return None
    relative = path[len(_TORCH) :].replace(os.sep, "/")
    rule = RULES.get((relative, function))
    if rule is not None:
        return rule
    return next((label for prefix, label in PACKAGES if relative.startswith(prefix)), None)


def ddp_bucket(group: str, index: int) -> str:
    """`DDP gradient bucket 0 (fc.bias, fc.weight)`: bucket `index` of the DDP model on `group`
    (its parameters as `remember_buckets` last read them); without one, only its number."""
    for ref, names in reversed(list(_models.values())):
        model = ref()
        if model is None or group_name(model.process_group) != group:
            continue
        if index < len(names):
            params = names[index]
            shown = ", ".join(params[:6]) + (
                f", ... {len(params) - 6} more" if len(params) > 6 else ""
            )
            return f"DDP gradient bucket {index} ({shown})"
    return f"DDP gradient bucket {index}"


def remember_buckets(model: Any) -> None:
    """Read which parameters each of a DDP model's buckets holds, from DDP's own logging data.

    Called after the constructor and when DDP has rebuilt its buckets (after its first step),
    never while the reducer runs: it holds its lock while it reduces a bucket.
    """
    try:
        data = model._get_ddp_logging_data()
        params = [(n, p) for n, p in model.module.named_parameters() if p.requires_grad]
    except (AttributeError, RuntimeError):
        return
    rebuilt = data.get("rebuilt_per_bucket_param_indices")
    if rebuilt:
        indices = [[int(i) for i in b.split()] for b in str(rebuilt).split(",")]
    else:  # before the rebuild: buckets hold the parameters in reverse, cut by byte size
        order = list(range(len(params)))[::-1]
        sizes = [int(b) for b in str(data.get("bucket_sizes", "")).split(",") if b.strip()]
        indices = _cut(order, [p.numel() * p.element_size() for _, p in params], sizes)
    key = id(model)
    names = [[params[i][0] for i in b if i < len(params)] for b in indices]
    if _models.pop(key, None) is None:
        weakref.finalize(model, _models.pop, key, None)
    _models[key] = (weakref.ref(model), names)


def forwarded(model: Any) -> None:
    """`model`'s forward ran: the buckets a backward reduces next are its."""
    entry = _models.pop(id(model), None)
    if entry is not None:
        _models[id(model)] = entry


def _cut(order: list[int], nbytes: list[int], sizes: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    it = iter(order)
    for size in sizes:
        bucket, total = [], 0
        for i in it:
            bucket.append(i)
            total += nbytes[i]
            if total >= size:
                break
        out.append(bucket)
    return out
