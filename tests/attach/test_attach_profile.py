"""Profiling a real torchrun job distnb did not start (`harness/slow_loader.py`: DDP over gloo,
a DataLoader whose Dataset is slow on rank 1): `%dist_attach --profile N`, `AttachedJob.profile`
and `%dist_profile` on the attached job name the slow rank and its cause, as on distnb's ranks."""

from __future__ import annotations

import io
import textwrap
import time
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from IPython.core.error import UsageError

from distnb.errors import ConfigError
from distnb.judgement.slowness import Phase
from distnb.views.profiling import ProfileView
from harness.jobs import in_fresh_kernel, job
from tests.attach.test_attach import attached
from tests.attach.test_inside import magics_on

pytestmark = pytest.mark.gloo

SLOW = Path(__file__).parents[2] / "harness" / "slow_loader.py"


def _slow_data_named(view: ProfileView, steps: int) -> None:
    result = view.result
    assert result.steps_by == "optimizer steps"
    assert [len(r.steps) for r in result.ranks] == [steps, steps]
    s = result.straggler
    assert s is not None, result.verdict
    assert (s.rank, s.phase, s.what) == (1, Phase.DATA, "data: DataLoader"), str(s)
    assert s.mine_ns > 30e6 > s.peers_ns  # 4 samples of 10 ms per batch
    assert "its DataLoader's next() takes" in str(s)
    # rank 0 waits for rank 1 at DDP's gradient all_reduce, whose events come from the tapes
    assert result.ranks[0].per_step(Phase.WAIT) > 20e6 > result.ranks[1].per_step(Phase.WAIT)


def test_dist_attach_profile_names_the_rank_with_the_slow_data_loader(tmp_path: Path) -> None:
    with job(tmp_path, script=SLOW) as jb:
        jb.wait_for(r"step 1 10(?!\d)")
        ip = magics_on(attached(jb.folder))
        out = io.StringIO()
        with redirect_stdout(out):
            ip.run_line_magic("dist_attach", "--profile 4")
        said = out.getvalue()
        assert said.startswith("distnb: profiling the next 4 optimizer steps"), said
        assert "rank 1 is" in said and "its DataLoader's next() takes" in said, said
        job_ = ip.magics_manager.registry["AttachMagics"].job
        assert job_.profiling == [] and job_.profiled == {}  # handed over, nothing left
        # the job goes on, unprofiled: its ranks dropped their profilers' hooks
        jb.wait_for(r"step 1 40(?!\d)")
        ip.run_line_magic("dist_attach", "--detach")


def test_dist_profile_on_the_attached_job_runs_until_the_report(tmp_path: Path) -> None:
    with job(tmp_path, script=SLOW) as jb:
        jb.wait_for(r"step 1 10(?!\d)")
        j = attached(jb.folder)
        ip = magics_on(j)
        out = io.StringIO()
        with redirect_stdout(out):
            ip.run_line_magic("dist_profile", "")  # on the attached job: until --report
        assert "the optimizer steps until --report" in out.getvalue(), out.getvalue()
        jb.wait_for(r"step 1 30(?!\d)")
        view = j.profile_report()
        counts = [len(r.steps) for r in view.result.ranks]
        assert min(counts) >= 5, counts  # the steps between the ask and the report
        s = view.result.straggler
        assert s is not None and (s.rank, s.phase) == (1, Phase.DATA), view.result.verdict
        with pytest.raises(UsageError, match="nothing is being profiled on the attached job"):
            ip.run_line_magic("dist_profile", "--report")
        # a detach drops a profile under way, on the ranks too
        j.profile(steps=1000)
        j.detach()
        j = attached(jb.folder)
        j.profiling = [0, 1]  # as if asked before: the ranks say they have none
        with pytest.raises(ConfigError, match="ranks 0-1 have no profile under way"):
            j.profile_report()
        j.profile(steps=3)
        view = j.profile_report()
        _slow_data_named(view, 3)
        export = tmp_path / "p.json"
        view.export_chrome_trace(export)
        assert export.stat().st_size > 0
        j.detach()


LIGHTNING = """
import time
import torch
import lightning as L
from torch.utils.data import DataLoader, TensorDataset

class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)
        )

    def training_step(self, batch, i):
        x, y = batch
        if self.global_rank == 1:
            time.sleep(0.02)  # an augmentation only rank 1 runs
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

data = TensorDataset(torch.randn(4096, 64), torch.randn(4096, 1))
trainer = L.Trainer(
    accelerator="cpu", strategy="ddp", devices=2, max_epochs=1000, logger=False,
    enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
)
trainer.fit(Model(), DataLoader(data, batch_size=16))
"""


def test_a_lightning_job_is_profiled_in_its_training_step_not_its_optimizer(
    tmp_path: Path,
) -> None:
    """Lightning runs the forward and backward inside `optimizer.step(closure)`: the step's own
    time is what follows the closure, and the slow training step is named."""
    script = tmp_path / "fit.py"
    script.write_text(LIGHTNING)
    with job(tmp_path, script=script) as jb:
        jb.agents_up()
        j = attached(jb.folder)
        while not all((s.step or 0) >= 3 for s in j.snapshots()):
            assert jb.proc.poll() is None, jb.log.read_text()[-3000:]
            time.sleep(0.2)
        j.profile(steps=4)
        result = j.profile_report().result
        assert [len(r.steps) for r in result.ranks] == [4, 4]
        s = result.straggler
        assert s is not None, result.verdict
        assert (s.rank, s.phase, s.what) == (1, Phase.COMPUTE, "module: Model"), str(s)
        for r in result.ranks:  # SGD's own update, not the closure's forward and backward
            assert r.per_step(Phase.OPTIMIZER) < 5e6, str(r)
        assert result.ranks[0].per_step(Phase.WAIT) > 10e6  # for rank 1, at DDP's all_reduce
        j.detach()


# in a fresh interpreter with a real IPython shell: SIGINT to itself as the wait for the profile
# starts (`tests/attach/test_attach_interrupts.py` does the same for the other phases)
KERNEL = textwrap.dedent(
    """
    import os, signal, sys
    from IPython.testing.globalipapp import start_ipython
    from distnb.session.attach import profiling

    original = profiling._collect
    def interrupted(job):
        profiling._collect = original
        os.kill(os.getpid(), signal.SIGINT)
        return original(job)

    ip = start_ipython()
    ip.run_line_magic("load_ext", "distnb")
    ip.run_cell(f"%dist_attach {sys.argv[1]}")
    profiling._collect = interrupted
    ip.run_cell("%dist_attach --profile 3")
    ip.run_cell("%dist_profile --report")
    ip.run_cell("%dist_attach --detach")
    """
)


def test_ctrl_c_while_waiting_for_the_profile_leaves_it_to_the_report(tmp_path: Path) -> None:
    with job(tmp_path, script=SLOW) as jb:
        jb.wait_for(r"step 1 10(?!\d)")
        out = in_fresh_kernel(KERNEL, jb.folder, tmp_path / "runs")
        said = [line for line in out.splitlines() if "interrupted" in line]
        assert said == [
            "KeyboardInterrupt: %dist_attach was interrupted while it waited for the profile: "
            f"still attached to job {jb.folder.name}; the ranks profile the steps asked "
            "(%dist_profile --report shows them once they have)"
        ], out[-3000:]
        assert "rank 1 is" in out and "its DataLoader's next() takes" in out, out[-3000:]
        assert "detached; the job goes on" in out, out[-3000:]
