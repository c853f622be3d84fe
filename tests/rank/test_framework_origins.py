"""Which framework function a collective was made by: the table read off installed Lightning,
Fabric, Accelerate and torchmetrics files, and the outermost of them naming the call."""

from __future__ import annotations

import accelerate.accelerator
import accelerate.utils.operations
import lightning.fabric.fabric
import lightning.fabric.utilities.distributed
import lightning.pytorch.core.module
import lightning.pytorch.strategies.ddp
import torchmetrics.utilities.distributed

from distnb.rank.checked.frameworks import framework_for


def label(module: object, function: str) -> str | None:
    found = framework_for(str(getattr(module, "__file__", "")), function)
    return found.label if found is not None else None


def test_the_frameworks_public_functions_are_named_as_their_users_call_them() -> None:
    assert label(lightning.pytorch.core.module, "log") == "Lightning self.log(sync_dist=True)"
    assert label(lightning.pytorch.core.module, "all_gather") == "Lightning self.all_gather"
    assert label(lightning.pytorch.strategies.ddp, "barrier") == "Lightning strategy.barrier"
    assert label(lightning.fabric.fabric, "all_reduce") == "Fabric all_reduce"
    assert label(accelerate.utils.operations, "gather") == "Accelerate gather"
    assert label(accelerate.accelerator, "wait_for_everyone") == (
        "Accelerate accelerator.wait_for_everyone"
    )
    assert label(torchmetrics.utilities.distributed, "gather_all_tensors") == (
        "torchmetrics metric sync"
    )


def test_other_functions_and_files_have_no_label() -> None:
    assert label(lightning.pytorch.core.module, "forward") is None
    # the helper every one of Lightning's reductions goes through is no user's word
    assert label(lightning.fabric.utilities.distributed, "_sync_ddp") is None
    assert framework_for("/elsewhere/lightning/pytorch/core/module.py", "log") is None
