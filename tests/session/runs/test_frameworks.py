"""Lightning's, Fabric's and Ignite's scripts under `%dist_run` on a real 2-rank gloo cluster,
as a user writes them, against the same scripts under a real `torchrun`.

A run must be a torchrun worker to every probe frameworks use to tell a notebook from a script
(Lightning refuses `strategy="ddp"` in a notebook), and give the cells their notebook back.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from distnb.errors import CollectiveMismatchError
from harness.processes import NAMED_S
from tests.session.runs.test_scripts import rank_lines, torchrun_output

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from distnb.session import Session

pytestmark = pytest.mark.cluster

# The probes of the standard library and IPython (cheap: the check tier runs them) ...
PROBES = """
import builtins, sys
import IPython
shell = IPython.get_ipython()
print("sys.ps1", hasattr(sys, "ps1"), "sys.ps2", hasattr(sys, "ps2"))
print("builtins", [n for n in ("get_ipython", "__IPYTHON__", "display") if n in vars(builtins)])
print("IPython.get_ipython()", None if shell is None else "shell")
print("exit", type(exit).__module__, "quit", type(quit).__module__)
print("sys.flags.interactive", sys.flags.interactive)
print("__main__ has __file__", hasattr(sys.modules["__main__"], "__file__"))
"""
# ... and the libraries' own (each imports its library afresh in a run)
LIBRARY_PROBES = """
import lightning.fabric.utilities.imports as lightning
import rich.console
import tqdm.auto
from transformers.utils import is_in_notebook
print("lightning _IS_INTERACTIVE", lightning._IS_INTERACTIVE)
print("tqdm.auto", tqdm.auto.tqdm.__module__)
print("rich is_jupyter", rich.console.Console().is_jupyter)
print("transformers is_in_notebook", is_in_notebook())
"""
# What a torchrun worker's probes print (test_probes_see_what_they_see_under_torchrun checks it)
WORKER = [
    "sys.ps1 False sys.ps2 False",
    "builtins []",
    "IPython.get_ipython() None",
    "exit _sitebuiltins quit _sitebuiltins",
    "sys.flags.interactive 0",
    "__main__ has __file__ True",
]
WORKER_LIBRARIES = [
    "lightning _IS_INTERACTIVE False",
    "tqdm.auto tqdm.asyncio",
    "rich is_jupyter False",
    "transformers is_in_notebook False",
]

MODEL = """
import torch, lightning as L
from torch.utils.data import DataLoader, TensorDataset

class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, i):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        LOG
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
trainer = L.Trainer(accelerator="cpu", strategy="ddp", devices=2, max_epochs=2,
                    enable_progress_bar=False, enable_model_summary=False, logger=False,
                    enable_checkpointing=False)
trainer.fit(Model(), DataLoader(data, batch_size=8))
loss = trainer.callback_metrics["loss"]
print("rank", trainer.global_rank, "of", trainer.world_size, "loss", round(float(loss), 4))
"""

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

SCRIPTS = {
    "probes.py": PROBES,
    "library_probes.py": PROBES + LIBRARY_PROBES,
    "fit.py": MODEL.replace("LOG", 'self.log("loss", loss, sync_dist=True)'),
    # the classic: a synced log on rank 0 only (its peer never makes the barrier it makes)
    "log_on_rank0.py": MODEL.replace(
        "LOG",
        'if self.global_rank == 0:\n            self.log("loss", loss, sync_dist=True)',
    ),
    "ignite_fit.py": IGNITE.replace("CALL", "trainer.run(loader, max_epochs=2)"),
    # the classic: a metric computed on rank 0 only (its compute syncs across ranks)
    "ignite_eval_on_rank0.py": IGNITE.replace(
        "CALL",
        "if rank == 0:\n        state = evaluator.run(loader)\n"
        '        print("mse", state.metrics["mse"])\n    return',
    ),
    "fabric_lengths.py": """
        import torch
        from lightning.fabric import Fabric

        fabric = Fabric(accelerator="cpu", strategy="ddp", devices=2)
        fabric.launch()
        values = torch.arange(3 + fabric.global_rank, dtype=torch.float32)
        total = fabric.all_reduce(values, reduce_op="sum")
        print("rank", fabric.global_rank, total.tolist())
    """,
}


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("frameworks")
    for name, text in SCRIPTS.items():
        (folder / name).write_text(textwrap.dedent(text).lstrip())
    return folder


@pytest.fixture
def torchrun() -> Path:
    found = Path(sys.executable).parent / "torchrun"
    if not found.exists():
        pytest.skip("no torchrun next to this Python")
    return found


@pytest.mark.check
def test_a_run_is_a_torchrun_worker_to_every_probe_and_the_cells_are_a_notebook(
    session: Session, shell: InteractiveShell, scripts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.run_line_magic("dist_run", str(scripts / "probes.py"))
    out = capsys.readouterr().out
    for rank in (0, 1):
        assert rank_lines(out, rank) == WORKER, out
    cell = session.run(PROBES)
    for rank in (0, 1):
        assert cell.stdout(rank).splitlines() == [
            "sys.ps1 False sys.ps2 False",  # a rank is no console: Lightning runs in cells
            "builtins ['get_ipython', '__IPYTHON__', 'display']",
            "IPython.get_ipython() shell",
            "exit IPython.core.autocall quit IPython.core.autocall",
            "sys.flags.interactive 0",
            "__main__ has __file__ False",
        ], cell.stdout(rank)


def test_probes_see_what_they_see_under_torchrun(
    session: Session,
    shell: InteractiveShell,
    scripts: Path,
    torchrun: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # a cell imported the libraries first: a run imports them afresh, as a worker does
    session.run(LIBRARY_PROBES)
    capsys.readouterr()
    shell.run_line_magic("dist_run", str(scripts / "library_probes.py"))
    ours = capsys.readouterr().out
    theirs = torchrun_output(torchrun, tmp_path, str(scripts / "library_probes.py"))
    for rank in (0, 1):
        assert theirs[rank].splitlines() == WORKER + WORKER_LIBRARIES
        assert rank_lines(ours, rank) == WORKER + WORKER_LIBRARIES, ours
    after = session.run(LIBRARY_PROBES)
    assert after.stdout(0).splitlines() == [
        "lightning _IS_INTERACTIVE False",
        "tqdm.auto tqdm.asyncio",  # an engine is no ipykernel app: no widget bars
        "rich is_jupyter True",
        "transformers is_in_notebook True",
    ], after.stdout(0)


def test_lightning_fits_as_under_torchrun_and_its_classic_hang_is_named(
    shell: InteractiveShell,
    scripts: Path,
    torchrun: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    expected = torchrun_output(torchrun, tmp_path, str(scripts / "fit.py"))
    finals = [[ln for ln in text.splitlines() if ln.startswith("rank ")] for text in expected]
    assert finals[0][0].startswith("rank 0 of 2 loss ")
    capsys.readouterr()
    for _ in range(2):  # twice in one session, the same
        shell.run_line_magic("dist_run", str(scripts / "fit.py"))
        out = capsys.readouterr().out
        for rank in (0, 1):
            assert [ln for ln in rank_lines(out, rank) if ln.startswith("rank ")] == finals[rank]
    # self.log(sync_dist=True) on rank 0 only: torchrun waits for good, distnb names it
    started = time.monotonic()
    with pytest.raises(CollectiveMismatchError) as caught:
        shell.run_line_magic("dist_run", str(scripts / "log_on_rank0.py"))
    assert time.monotonic() - started < NAMED_S
    said = str(caught.value)
    assert "log_on_rank0.py:13" in said and 'self.log("loss", loss, sync_dist=True)' in said, said
    # each call in the framework's words: the barrier self.log makes, and DDP's bucket
    assert said.splitlines()[0] == (
        "op type mismatch in barrier/all_reduce #15 on WORLD: rank 1 skipped the barrier that "
        "Lightning self.log(sync_dist=True) makes on rank 0; its call here is all_reduce from "
        "DDP gradient bucket 0 (layer.bias, layer.weight)"
    ), said
    assert "barrier() [Lightning self.log(sync_dist=True)]" in said, said
    # the session goes on: the same fit again
    shell.run_line_magic("dist_run", str(scripts / "fit.py"))
    out = capsys.readouterr().out
    assert [ln for ln in rank_lines(out, 1) if ln.startswith("rank ")] == finals[1], out


def test_ignite_trains_as_under_torchrun_and_its_metric_on_rank_0_only_is_named(
    shell: InteractiveShell,
    scripts: Path,
    torchrun: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    expected = torchrun_output(torchrun, tmp_path, str(scripts / "ignite_fit.py"))
    finals = [[ln for ln in text.splitlines() if ln.startswith("rank ")] for text in expected]
    assert finals[0] and finals[0][0].startswith("rank 0 loss "), expected
    capsys.readouterr()
    for _ in range(2):  # idist.Parallel ends the process group each time; distnb makes it again
        shell.run_line_magic("dist_run", str(scripts / "ignite_fit.py"))
        out = capsys.readouterr().out
        for rank in (0, 1):
            assert [ln for ln in rank_lines(out, rank) if ln.startswith("rank ")] == finals[rank]
    # rank 1 leaves idist.Parallel, ending the group, while rank 0's metric syncs: under torchrun
    # rank 0 reads "Connection reset by peer" in gloo; distnb names the metric and the end
    script = str(scripts / "ignite_eval_on_rank0.py")
    theirs = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node", "2", script],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert theirs.returncode != 0 and "Connection reset by peer" in theirs.stderr, theirs.stderr
    started = time.monotonic()
    with pytest.raises(CollectiveMismatchError) as caught:
        shell.run_line_magic("dist_run", script)
    assert time.monotonic() - started < NAMED_S
    said = str(caught.value)
    assert said.splitlines()[0] == (
        "op type mismatch in all_reduce/barrier #4 on WORLD: rank 1 skipped the all_reduce that "
        "Ignite metric sync makes on rank 0; its call here is barrier from destroy_process_group"
    ), said
    assert "ignite_eval_on_rank0.py:28: state = evaluator.run(loader)" in said, said
    assert 'ignite_eval_on_rank0.py:35: with idist.Parallel(backend="gloo")' in said, said
    assert "hint: Ignite metric sync makes a collective: every rank calls it" in said, said
    shell.run_line_magic("dist_run", str(scripts / "ignite_fit.py"))  # the session goes on
    out = capsys.readouterr().out
    assert [ln for ln in rank_lines(out, 1) if ln.startswith("rank ")] == finals[1], out


def test_a_fabric_all_reduce_of_different_lengths_is_named_at_its_line(
    shell: InteractiveShell, scripts: Path
) -> None:
    started = time.monotonic()
    with pytest.raises(CollectiveMismatchError) as caught:
        shell.run_line_magic("dist_run", str(scripts / "fabric_lengths.py"))
    assert time.monotonic() - started < NAMED_S
    said = str(caught.value)
    assert "fabric_lengths.py:7" in said and "[3]" in said and "[4]" in said, said
    assert "all_reduce #1 on WORLD (Fabric all_reduce)" in said, said
    assert os.path.basename(str(scripts / "fabric_lengths.py")) in said


def test_lightning_and_fabric_run_in_cells_on_the_sessions_ranks(
    session: Session, shell: InteractiveShell, scripts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.run_line_magic("dist_run", str(scripts / "fit.py"))
    out = capsys.readouterr().out
    finals = [[ln for ln in rank_lines(out, r) if ln.startswith("rank ")] for r in (0, 1)]
    assert finals[0] and finals[0][0].startswith("rank 0 of 2 loss "), out
    fit = (
        "import psutil\nbefore = {c.pid for c in psutil.Process().children(recursive=True)}\n"
        + textwrap.dedent(SCRIPTS["fit.py"])
        + "after = {c.pid for c in psutil.Process().children(recursive=True)}\n"
        + "print('new processes', len(after - before))\n"
    )
    for _ in range(2):  # a cell's Trainer is the session's ranks, again and again: no forks
        cell = session.run(fit)
        for rank in (0, 1):
            lines = cell.stdout(rank).splitlines()
            assert [ln for ln in lines if ln.startswith("rank ")] == finals[rank]
            assert lines[-1] == "new processes 0", lines
    fabric = session.run(
        "from lightning.fabric import Fabric\n"
        "fabric = Fabric(accelerator='cpu', strategy='ddp', devices=2)\n"
        "fabric.launch()\n"
        "fabric.all_reduce(torch.ones(3) * (fabric.global_rank + 1), reduce_op='sum').tolist()"
    )
    assert fabric.result(0) == fabric.result(1) == "[3.0, 3.0, 3.0]"
