"""The framework function a collective was made by, in the framework user's words.

Lightning, Fabric, Accelerate, torchmetrics, Ignite and transformers' Trainer call
`torch.distributed` on the user's behalf: a report that says only "barrier() at `self.log(...)`"
leaves the user to guess why a log line makes a barrier. A collective made under one of the
public functions below carries its name as its origin ("Lightning self.log(sync_dist=True)"), as
DDP's buckets carry theirs (`origin`). Where such functions call one another (`self.log` ->
`strategy.reduce`), the outermost names the call: the one the user (or the framework's loop)
called. The judgement says a rank that did not make such a call skipped it
(`distnb.judgement.mismatch.framework_skip`).

Keyed by (file under the installed package's folder, function): the table is read once per code
object, on the same frame walk that finds the call site.
"""

from __future__ import annotations

import os
import sysconfig

__all__ = ["Framework", "framework_for"]


class Framework:
    """A framework function's label: the outermost on the stack names the call."""

    __slots__ = ("label",)

    def __init__(self, label: str) -> None:
        self.label = label


_LIGHTNING_STRATEGIES = ("strategy.py", "ddp.py", "parallel.py", "fsdp.py")

_TABLE: dict[tuple[str, str], str] = {
    ("lightning/pytorch/core/module.py", "log"): "Lightning self.log(sync_dist=True)",
    ("lightning/pytorch/core/module.py", "log_dict"): "Lightning self.log_dict(sync_dist=True)",
    ("lightning/pytorch/core/module.py", "all_gather"): "Lightning self.all_gather",
    (
        "lightning/pytorch/trainer/trainer.py",
        "save_checkpoint",
    ): "Lightning trainer.save_checkpoint",
    (
        "lightning/pytorch/loops/training_epoch_loop.py",
        "_broadcast_sigterm_tensor",
    ): "Lightning fit loop (each step's SIGTERM broadcast)",
    **{
        (f"lightning/pytorch/strategies/{file}", name): f"Lightning strategy.{name}"
        for file in _LIGHTNING_STRATEGIES
        for name in ("barrier", "broadcast", "reduce", "all_gather", "reduce_boolean_decision")
    },
    **{
        ("lightning/fabric/fabric.py", name): f"Fabric {name}"
        for name in ("all_reduce", "all_gather", "barrier", "broadcast")
    },
    **{
        (f"lightning/fabric/strategies/{file}", name): f"Fabric strategy.{name}"
        for file in _LIGHTNING_STRATEGIES
        for name in ("all_reduce", "all_gather", "barrier", "broadcast", "reduce_boolean_decision")
    },
    **{
        ("accelerate/utils/operations.py", name): f"Accelerate {name}"
        for name in (
            "gather",
            "gather_object",
            "broadcast",
            "broadcast_object_list",
            "pad_across_processes",
            "reduce",
        )
    },
    **{
        ("accelerate/accelerator.py", name): f"Accelerate accelerator.{name}"
        for name in ("gather", "gather_for_metrics", "reduce", "wait_for_everyone")
    },
    ("accelerate/state.py", "wait_for_everyone"): "Accelerate wait_for_everyone",
    ("torchmetrics/utilities/distributed.py", "gather_all_tensors"): "torchmetrics metric sync",
    **{
        ("ignite/distributed/utils.py", name): f"Ignite idist.{name}"
        for name in ("all_reduce", "all_gather", "all_gather_tensors_with_shapes", "broadcast")
    },
    ("ignite/distributed/utils.py", "barrier"): "Ignite idist.barrier",
    ("ignite/metrics/metric.py", "another_wrapper"): "Ignite metric sync",  # @sync_all_reduce
    **{
        ("transformers/trainer.py", name): f"Trainer {name}"
        for name in ("evaluate", "predict", "save_model", "_save_checkpoint")
    },
}
_RULES = {key: Framework(label) for key, label in _TABLE.items()}
_ROOTS = tuple(
    {
        os.path.abspath(p) + os.sep
        for key in ("purelib", "platlib")
        if (p := sysconfig.get_paths().get(key))
    }
)


def framework_for(path: str, function: str) -> Framework | None:
    """The label of a framework's function (`path` absolute), or None."""
    for root in _ROOTS:
        if path.startswith(root):
            relative = path[len(root) :].replace(os.sep, "/")
            return _RULES.get((relative, function))
    return None
