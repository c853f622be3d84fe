"""Scripts as users of the training frameworks write them, the classic mistakes among them, and
what torchrun and distnb say of each on this machine.

A `Case` is a script (a file for `%dist_run` and torchrun; its text runs as a cell too), the
verdict `torchrun --standalone --nproc-per-node 2` gives it here (torch 2.13 CPU, gloo, the
releases constraints.txt pins), and the first line of the error distnb raises ("" where it
passes). `tests/session/runs/test_frameworks.py` runs each under distnb, as a script and as a
cell; `python bench/bench_frameworks.py` derives torchrun's verdicts again and times both.

"hangs": torchrun had not ended after the bench's limit (60 s; its process group would wait 30
minutes). The sequence numbers in distnb's lines count the collectives the frameworks make
before the mistake (Lightning's fit makes 22 by its first synced log): they move with the
frameworks' releases, which constraints.txt pins.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CASES", "Case", "write_scripts"]


@dataclass(frozen=True)
class Case:
    framework: str
    mistake: str  # what the user did, in a few words ("" for a script that is right)
    source: str
    torchrun: str  # "pass", "hangs", or how it failed ("gloo lost its peer": no Python line)
    distnb: str  # the first line of distnb's error; "" where it passes

    @property
    def passes(self) -> bool:
        return not self.distnb


def _fill(template: str, **parts: str) -> str:
    for key, value in parts.items():
        template = template.replace(key.upper(), value)
    return textwrap.dedent(template).lstrip()


LIGHTNING = """
import os
import torch, lightning as L
from torch.utils.data import DataLoader, Subset, TensorDataset

class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        INIT

    def training_step(self, batch, i):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        LOG
        return loss

    def validation_step(self, batch, i):
        x, y = batch
        VALIDATE

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
trainer = L.Trainer(accelerator="cpu", strategy="ddp", devices=2, max_epochs=2,
                    enable_progress_bar=False, enable_model_summary=False, logger=False,
                    enable_checkpointing=False, OPTIONS)
trainer.fit(Model(), LOADERS)
AFTER
loss = trainer.callback_metrics["loss"]
print("rank", trainer.global_rank, "of", trainer.world_size, "loss", round(float(loss), 4))
"""
_LIGHTNING_PARTS = {
    "init": "",
    "log": 'self.log("loss", loss, sync_dist=True)',
    "validate": 'self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y), '
    "sync_dist=True)",
    "options": "use_distributed_sampler=True",
    "loaders": "DataLoader(data, batch_size=8), DataLoader(data, batch_size=8)",
    "after": "",
}


def lightning(**parts: str) -> str:
    """The Lightning script, with some of its parts (`log`, `validate`, ...) written otherwise."""
    return _fill(LIGHTNING, **{**_LIGHTNING_PARTS, **parts})


IGNITE = """
import torch
import ignite.distributed as idist
from ignite.engine import Engine
from ignite.metrics import MeanSquaredError
from torch.utils.data import TensorDataset


def training(local_rank, config):
    rank = idist.get_rank()
    torch.manual_seed(0)
    model = idist.auto_model(torch.nn.Linear(4, 1))
    optimizer = idist.auto_optim(torch.optim.SGD(model.parameters(), lr=0.1))
    data = torch.randn(32, 4)
    loader = idist.auto_dataloader(TensorDataset(data, data.sum(1, keepdim=True)), batch_size=8)

    def step(engine, batch):
        x, y = batch
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.item()

    trainer = Engine(step)
    evaluator = Engine(lambda engine, batch: (model(batch[0]), batch[1]))
    MeanSquaredError().attach(evaluator, "mse")
    CALL
    total = idist.all_reduce(torch.tensor(trainer.state.output or 0.0))
    print("rank", rank, "loss", round(total.item(), 4))


with idist.Parallel(backend="gloo") as parallel:
    parallel.run(training, {})
"""

FABRIC = """
import torch
from lightning.fabric import Fabric

fabric = Fabric(accelerator="cpu", strategy="ddp", devices=2)
fabric.launch()
values = torch.arange(LENGTH, dtype=torch.float32)
total = fabric.all_reduce(values, reduce_op="sum")
print("rank", fabric.global_rank, total.tolist())
"""

ACCELERATE = """
import torch
from accelerate import Accelerator

accelerator = Accelerator(cpu=True)
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
loader = torch.utils.data.DataLoader(data, batch_size=8)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for x, y in loader:
    loss = torch.nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
END
"""
_ACCELERATE_END = (
    'print("rank", accelerator.process_index, "loss", '
    'round(accelerator.reduce(loss, "mean").item(), 4))'
)

TRAINER = """
import torch
from transformers import Trainer, TrainingArguments


class Data(torch.utils.data.Dataset):
    def __init__(self):
        self.x = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.x[i].sum()}


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 1)

    def forward(self, x, labels=None):
        out = self.fc(x).squeeze(-1)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


torch.manual_seed(0)
args = TrainingArguments(output_dir="trainer-out", per_device_train_batch_size=4,
                         num_train_epochs=1, use_cpu=True, report_to=[], save_strategy="no",
                         logging_strategy="no", disable_tqdm=True)
trainer = Trainer(model=Model(), args=args, train_dataset=Data(), eval_dataset=Data())
trainer.train()
EVALUATE
print("rank", args.process_index, "eval_loss", round(metrics["eval_loss"], 4))
"""

CASES: dict[str, Case] = {
    "lightning_fit.py": Case("Lightning", "", lightning(), "pass", ""),
    "lightning_log_on_rank0.py": Case(
        "Lightning",
        "self.log(sync_dist=True) on rank 0 only",
        lightning(
            log='if self.global_rank == 0:\n            self.log("loss", loss, sync_dist=True)'
        ),
        "hangs",
        "op type mismatch in barrier/all_reduce #22 on WORLD: rank 1 skipped the barrier that "
        "Lightning self.log(sync_dist=True) makes on rank 0; its call here is all_reduce from "
        "DDP gradient bucket 0 (layer.bias, layer.weight)",
    ),
    "lightning_all_gather_on_rank0.py": Case(
        "Lightning",
        "self.all_gather on rank 0 only",
        lightning(validate="if self.global_rank == 0:\n            self.all_gather(self.layer(x))"),
        "hangs",
        "op type mismatch in all_gather/barrier #12 on WORLD: rank 1 skipped the all_gather that "
        "Lightning self.all_gather makes on rank 0; its call here is barrier from Lightning "
        "strategy.barrier",
    ),
    "lightning_metric_on_rank0.py": Case(
        "Lightning",
        "a torchmetrics metric computed on rank 0 only",
        lightning(
            init="import torchmetrics\n        self.mse = torchmetrics.MeanSquaredError()",
            validate="self.mse.update(self.layer(x), y)\n"
            "        if self.global_rank == 0 and i == 3:\n"
            '            print("mse", float(self.mse.compute()))',
        ),
        "hangs",
        "op type mismatch in barrier/broadcast #35 on WORLD: rank 1 skipped the barrier that "
        "torchmetrics metric sync makes on rank 0; its call here is broadcast from Lightning "
        "fit loop (each step's SIGTERM broadcast)",
    ),
    "lightning_save_on_rank0.py": Case(
        "Lightning",
        "trainer.save_checkpoint on rank 0 only",
        lightning(
            after='if trainer.global_rank == 0:\n    trainer.save_checkpoint("lightning.ckpt")'
        ),
        "rank 0 fails: gloo lost its peer",
        "rank 1 finished the script lightning_save_on_rank0.py without calling barrier #63 on "
        "WORLD (Lightning trainer.save_checkpoint), which rank 0 waits at "
        "lightning_save_on_rank0.py:31",
    ),
    "lightning_uneven_shards.py": Case(
        "Lightning",
        "each rank shards its data by hand, one batch fewer on rank 1",
        lightning(
            options="use_distributed_sampler=False",
            loaders="DataLoader(shard, batch_size=8), DataLoader(shard, batch_size=8)",
        ).replace(
            "trainer.fit(",
            'rank = int(os.environ["RANK"])\n'
            "shard = Subset(data, range(rank * 32, rank * 32 + 32 - 8 * rank))\n"
            "trainer.fit(",
        ),
        "hangs",
        "op type mismatch in broadcast/barrier #35 on WORLD: rank 0 calls broadcast, rank 1 "
        "calls barrier",
    ),
    "fabric_lengths.py": Case(
        "Fabric",
        "all_reduce of tensors of different lengths",
        _fill(FABRIC, length="3 + fabric.global_rank"),
        "rank 0 fails: gloo lost its peer",
        "shape mismatch in all_reduce #1 on WORLD (Fabric all_reduce): the tensors differ in "
        "shape (rank 0: [3], rank 1: [4])",
    ),
    "ignite_fit.py": Case(
        "Ignite", "", _fill(IGNITE, call="trainer.run(loader, max_epochs=2)"), "pass", ""
    ),
    "ignite_eval_on_rank0.py": Case(
        "Ignite",
        "a metric computed on rank 0 only",
        _fill(
            IGNITE,
            call="if rank == 0:\n        state = evaluator.run(loader)\n"
            '        print("mse", state.metrics["mse"])\n    return',
        ),
        "rank 0 fails: gloo lost its peer",
        "op type mismatch in all_reduce/barrier #4 on WORLD: rank 1 skipped the all_reduce that "
        "Ignite metric sync makes on rank 0; its call here is barrier from destroy_process_group",
    ),
    "accelerate_fit.py": Case("Accelerate", "", _fill(ACCELERATE, end=_ACCELERATE_END), "pass", ""),
    "accelerate_gather_on_rank0.py": Case(
        "Accelerate",
        "accelerator.gather on the main process only",
        _fill(
            ACCELERATE,
            end="if accelerator.is_main_process:\n"
            "    print(accelerator.gather(model(torch.ones(2, 4))).shape)\n" + _ACCELERATE_END,
        ),
        "hangs",
        "op type mismatch in all_gather/all_reduce #7 on WORLD: rank 0 calls all_gather, rank 1 "
        "calls all_reduce",
    ),
    "trainer_fit.py": Case(
        "Trainer", "", _fill(TRAINER, evaluate="metrics = trainer.evaluate()"), "pass", ""
    ),
    "trainer_evaluate_on_rank0.py": Case(
        "Trainer",
        "trainer.evaluate() on the main process only",
        _fill(
            TRAINER,
            evaluate="metrics = {'eval_loss': 0.0}\n"
            "if trainer.is_world_process_zero():\n"
            "    metrics = trainer.evaluate()",
        ),
        "rank 0 fails: gloo lost its peer",
        "rank 1 finished the script trainer_evaluate_on_rank0.py without calling all_gather #12 "
        "on WORLD (Trainer evaluate), which rank 0 waits at trainer_evaluate_on_rank0.py:34",
    ),
}


def write_scripts(folder: Path) -> Path:
    """Each case's script in `folder`, by its name; `folder` back."""
    for name, case in CASES.items():
        (folder / name).write_text(case.source)
    return folder
