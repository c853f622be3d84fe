"""Profiling cells on real gloo ranks: cells whose slowness is known, each named with its rank
and cause; through `Session.run(..., profile=True)`, `Session.profile` and the magics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from IPython.core.error import UsageError

from distnb.errors import ConfigError
from distnb.judgement.slowness import Phase
from distnb.views.profiling import ProfileView

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from distnb.session import Session

pytestmark = pytest.mark.cluster

SETUP = """
import time
from torch.utils.data import DataLoader, Dataset
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

def train(batches, extra=None):
    for x in batches:
        if extra is not None:
            x = extra(x)
        model(x).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()
"""

SLOW_LOADER = """
class Slow(Dataset):
    def __len__(self):
        return 20
    def __getitem__(self, i):
        if rank == 1:
            time.sleep(0.01)
        return torch.randn(256)

train(DataLoader(Slow(), batch_size=4))
"""

# Batches made whole beforehand: through a DataLoader over a TensorDataset, rank 1's 2048 rows
# are fetched and stacked one by one, and its data loading is what is slow (as distnb says).
BIG_BATCH = """
batch = 2048 if rank == 1 else 16
train([torch.randn(batch, 256) for _ in range(4)])
"""

SLOW_MODULE = """
class Lookup(torch.nn.Module):
    def forward(self, x):
        time.sleep(0.03)
        return x

train([torch.randn(8, 256) for _ in range(4)], Lookup() if rank == 1 else None)
"""


def _profiled(session: Session, cell: str) -> ProfileView:
    session.run(SETUP)
    (view,) = session.run(cell, profile=True).views
    assert isinstance(view, ProfileView)
    return view


def test_a_slow_data_loader_on_rank_1_is_named(session: Session) -> None:
    result = _profiled(session, SLOW_LOADER).result
    assert result.steps_by == "optimizer steps"
    assert [len(r.steps) for r in result.ranks] == [5, 5]
    s = result.straggler
    assert s is not None, result.verdict
    assert (s.rank, s.phase, s.what) == (1, Phase.DATA, "data: DataLoader"), str(s)
    assert s.mine_ns > 35e6 and s.peers_ns < 10e6  # 4 sleeps of 10 ms per batch
    assert "rank 1 is" in str(s) and "its DataLoader's next() takes" in str(s)
    # rank 0 waits for rank 1 at the gradients' all_reduce
    assert result.ranks[0].per_step(Phase.WAIT) > 30e6 > result.ranks[1].per_step(Phase.WAIT)


def test_a_bigger_batch_on_rank_1_is_named_as_compute(session: Session) -> None:
    result = _profiled(session, BIG_BATCH).result
    s = result.straggler
    assert s is not None, result.verdict
    assert (s.rank, s.phase) == (1, Phase.COMPUTE), str(s)
    # forward + backward: the model, or its first layer (named by its path, not its class)
    assert s.what in ("module: Sequential", "module: Sequential.0 (Linear)"), str(s)


def test_a_slow_module_only_rank_1_runs_is_named(session: Session) -> None:
    result = _profiled(session, SLOW_MODULE).result
    s = result.straggler
    assert s is not None, result.verdict
    assert (s.rank, s.phase, s.what) == (1, Phase.COMPUTE, "module: Lookup"), str(s)
    assert str(s).startswith("rank 1 is ") and "its module Lookup takes" in str(s)


def test_profile_steps_stops_after_n_steps_and_lines_up_with_the_collectives(
    session: Session, tmp_path: Path
) -> None:
    session.run(SETUP)
    session.profile(steps=2)
    session.run(SLOW_LOADER)  # 5 steps: the profile keeps 2
    session.run("x = torch.ones(4)")  # after the limit: not recorded
    view = session.profile_report()
    assert [len(r.steps) for r in view.result.ranks] == [2, 2]
    assert all(len(p.windows) == 1 for p in view.profiles)
    assert view.result.straggler is not None and view.result.straggler.rank == 1
    view.export_chrome_trace(tmp_path / "p.json")
    trace = json.loads((tmp_path / "p.json").read_text())["traceEvents"]
    assert {e["pid"] for e in trace if e["name"] == "process_name"} == {0, 1}
    # one clock: each all_reduce starts on every rank after its last member arrived, and its
    # members' bars overlap (none ends before the last one starts), however loaded the machine
    t0 = json.loads((tmp_path / "p.json").read_text())["otherData"]["t0_ns"]
    last_in: dict[tuple[str, int], int] = {}
    for e in view.events:
        last_in[e.group, e.seq] = max(last_in.get((e.group, e.seq), 0), e.arrive_ns)
    bars: dict[tuple[str, int], dict[int, tuple[float, float]]] = {}
    for e in trace:
        if e["name"] == "all_reduce":
            call = (e["args"]["group"], e["args"]["seq"])
            bars.setdefault(call, {})[e["pid"]] = (e["ts"], e["ts"] + e["dur"])
    assert bars and all(set(b) == {0, 1} for b in bars.values()), bars
    for call, by_rank in bars.items():
        assert all(t0 + start * 1000 >= last_in[call] - 1000 for start, _ in by_rank.values())
        assert max(s for s, _ in by_rank.values()) <= min(end for _, end in by_rank.values()) + 0.01
    kinds = {e.get("cat") for e in trace}
    assert {"data", "module", "optimizer", "op", "step", "wait", "collective"} <= kinds


def test_a_script_run_with_dist_run_is_profiled(session: Session, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import time, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "model = torch.nn.Linear(64, 64)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "for step in range(4):\n"
        "    if dist.get_rank() == 1:\n"
        "        time.sleep(0.02)\n"
        "    model(torch.randn(8, 64)).sum().backward()\n"
        "    for p in model.parameters():\n"
        "        dist.all_reduce(p.grad)\n"
        "    opt.step()\n"
        "    opt.zero_grad()\n"
    )
    session.profile()
    session.run_script(str(script))
    s = session.profile_report().result.straggler
    assert s is not None and (s.rank, s.phase) == (1, Phase.OTHER), str(s)
    assert "its host time outside torch ops (Python, sleeps, I/O) takes" in str(s)


def test_nothing_profiled_says_how_to_start(session: Session) -> None:
    with pytest.raises(ConfigError, match="nothing is being profiled"):
        session.profile_report()
    with pytest.raises(ConfigError, match="1 or more"):
        session.profile(steps=0)


def test_magics_profile_a_cell_and_the_next_cells(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    shell.run_cell_magic("allranks", "", SETUP)
    shell.run_cell_magic("allranks", "--profile", SLOW_MODULE)
    out = capsys.readouterr().out
    assert "profile of 2 ranks, 4 optimizer steps each" in out
    assert "its module Lookup takes" in out
    shell.run_line_magic("dist_profile", "--steps 3")
    assert "profiling the next cells until 3 optimizer steps" in capsys.readouterr().out
    shell.run_cell_magic("allranks", "", SLOW_LOADER)
    path = tmp_path / "trace.json"
    shell.run_line_magic("dist_profile", f"--report --export {path}")
    out = capsys.readouterr().out
    assert "3 optimizer steps each" in out and "its DataLoader's next() takes" in out
    assert json.loads(path.read_text())["otherData"]["producer"] == "distnb"
    with pytest.raises(UsageError, match="--export goes with --report"):
        shell.run_line_magic("dist_profile", f"--export {path}")
    with pytest.raises(UsageError, match="--steps must be at least 1"):
        shell.run_line_magic("dist_profile", "--steps 0")


def test_a_profiled_cell_that_fails_leaves_no_profiler_running(session: Session) -> None:
    from distnb.errors import RankError
    from distnb.rank import profiling

    with pytest.raises(RankError, match="ValueError"):
        session.run("x = torch.ones(3) @ torch.ones(3)\nraise ValueError(rank)", profile=True)
    assert session.call(profiling.armed) == [False, False]
    session.run("y = torch.ones(3)")  # and the next cell runs unprofiled
    assert session.call(profiling.armed) == [False, False]
