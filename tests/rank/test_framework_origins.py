"""Which framework function a collective was made by: the table read off installed Lightning,
Fabric, Accelerate, torchmetrics, Ignite and transformers files (found, not imported: their
imports take seconds), and the outermost of them naming the call."""

from __future__ import annotations

import importlib.util
import os

from distnb.judgement.words import LOOP_LABELS, framework_call, framework_of
from distnb.rank.checked.frameworks import _TABLE, framework_for


def installed(file: str) -> str:
    """The path of an installed package's file, without the package's slow import."""
    spec = importlib.util.find_spec(file.split("/")[0])
    assert spec is not None and spec.origin is not None, f"{file}'s package is not installed"
    path = os.path.join(os.path.dirname(os.path.dirname(spec.origin)), file)
    assert os.path.exists(path), path
    return path


def label(file: str, function: str) -> str | None:
    found = framework_for(installed(file), function)
    return found.label if found is not None else None


def test_the_frameworks_public_functions_are_named_as_their_users_call_them() -> None:
    for file, function, said in (
        ("lightning/pytorch/core/module.py", "log", "Lightning self.log(sync_dist=True)"),
        ("lightning/pytorch/core/module.py", "all_gather", "Lightning self.all_gather"),
        ("lightning/pytorch/strategies/ddp.py", "barrier", "Lightning strategy.barrier"),
        (
            "lightning/pytorch/trainer/trainer.py",
            "save_checkpoint",
            "Lightning trainer.save_checkpoint",
        ),
        ("lightning/fabric/fabric.py", "all_reduce", "Fabric all_reduce"),
        ("accelerate/utils/operations.py", "gather", "Accelerate gather"),
        (
            "accelerate/accelerator.py",
            "wait_for_everyone",
            "Accelerate accelerator.wait_for_everyone",
        ),
        ("torchmetrics/utilities/distributed.py", "gather_all_tensors", "torchmetrics metric sync"),
        ("ignite/distributed/utils.py", "all_reduce", "Ignite idist.all_reduce"),
        ("ignite/metrics/metric.py", "another_wrapper", "Ignite metric sync"),
        ("transformers/trainer.py", "evaluate", "Trainer evaluate"),
    ):
        assert label(file, function) == said


def test_other_functions_and_files_have_no_label() -> None:
    assert label("lightning/pytorch/core/module.py", "forward") is None
    # the helper every one of Lightning's reductions goes through is no user's word
    assert label("lightning/fabric/utilities/distributed.py", "_sync_ddp") is None
    assert framework_for("/elsewhere/lightning/pytorch/core/module.py", "log") is None


def test_every_label_is_known_to_the_judgement_as_a_framework_call() -> None:
    assert all(framework_of(said) for said in _TABLE.values())
    users = [said for said in _TABLE.values() if not said.split(" ", 1)[1].startswith(LOOP_LABELS)]
    assert users and all(framework_call(said) for said in users)
    # a strategy's and a loop's own calls are the framework's: a rank that makes one skipped none
    assert not framework_call("Lightning strategy.barrier")
    assert not framework_call("Lightning fit loop (each step's SIGTERM broadcast)")
    assert not framework_call("DDP gradient bucket 0 (fc.bias, fc.weight)")
    assert not framework_call("destroy_process_group")
