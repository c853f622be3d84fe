"""Replica checks on real ranks: drift that crashes nothing, found by name, ranks and size."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from distnb.session import Session

pytestmark = pytest.mark.cluster

DDP_MODEL = """\
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))
ddp = DDP(net, broadcast_buffers=False)
opt = torch.optim.Adam(ddp.parameters(), lr=0.01)
torch.manual_seed(rank)  # each rank's own batches
for _ in range(2):
    opt.zero_grad()
    ddp(torch.randn(16, 4)).sum().backward()
    opt.step()
"""


def test_replicas_that_agree_say_so_in_one_line(session: Session) -> None:
    session.run(DDP_MODEL)
    view = session.diff("ddp", "opt", grads=True)
    assert view.agree, str(view)
    n = 6 * 3 + 2  # parameters, their grads, Adam's step/exp_avg/exp_avg_sq; lr, betas...
    assert str(view).startswith("replicas agree: ") and "on ranks 0-1" in str(view)
    assert view.report.compared >= n


def test_a_parameter_changed_on_one_rank_is_named_with_its_size(session: Session) -> None:
    session.run(DDP_MODEL)
    session.run("with torch.no_grad():\n    if rank == 1:\n        net[2].weight[0, 3] += 0.25")
    view = session.diff("ddp")
    text = str(view)
    assert not view.agree and text.startswith("replicas differ: 1 of ")
    (d,) = view.report.differences
    assert d.name == "ddp.2.weight" and d.agree == ((0,), (1,))
    assert d.max_abs == pytest.approx(0.25) and d.index == (0, 3)
    assert "ddp.2.weight  0 | 1" in text


def test_buffers_that_drift_without_broadcast(session: Session) -> None:
    session.run(DDP_MODEL)  # BatchNorm running stats: each rank's own batches, not broadcast
    assert session.diff("ddp").agree
    view = session.diff("ddp", buffers=True)
    names = {d.name for d in view.report.differences}
    assert {"ddp.1.running_mean", "ddp.1.running_var"} <= names


def test_a_per_rank_learning_rate(session: Session) -> None:
    session.run(DDP_MODEL + "opt.param_groups[0]['lr'] = 0.01 * (rank + 1)\n")
    (d,) = [d for d in session.diff("opt").report.differences if d.name.endswith(".lr")]
    assert d.name == "opt.param_groups[0].lr" and d.values == ("0.01", "0.02")
    assert "0: 0.01 | 1: 0.02" in str(session.diff("opt"))


def test_bits_not_values_a_swap_and_a_nan(session: Session) -> None:
    session.run(
        "a = torch.arange(6.0)\n"
        "if rank == 1:\n    a[[1, 2]] = a[[2, 1]]\n"  # the same sum, another order
        "b = torch.zeros(3)\nif rank == 1:\n    b[2] = float('nan')\n"
        "batch = {'x': torch.ones(2, 2), 'ids': [torch.arange(3)]}"
    )
    view = session.diff("a", "b", "batch")
    found = {d.name: d for d in view.report.differences}
    assert set(found) == {"a", "b"}
    assert found["a"].max_abs == 1.0
    assert found["b"].max_abs == float("inf") and found["b"].index == (2,)


def test_data_that_should_differ_by_rank(session: Session) -> None:
    session.run(
        "from torch.utils.data import DataLoader, DistributedSampler, TensorDataset\n"
        "data = TensorDataset(torch.arange(64.0).reshape(32, 2))\n"
        "(plain,) = next(iter(DataLoader(data, batch_size=4, shuffle=False)))  # forgot it\n"
        "(sampled,) = next(iter(DataLoader(data, batch_size=4, sampler=DistributedSampler(data))))"
    )
    view = session.diff("plain", "sampled", expect="differ")
    assert [(d.name, d.agree) for d in view.report.differences] == [("plain", ((0, 1),))]
    assert "identical where they should differ: 1 of 2" in str(view)
    assert "DistributedSampler" in str(view)


def test_gradient_accumulation_that_never_syncs(session: Session) -> None:
    session.run(DDP_MODEL)
    session.diff_watch("ddp", optim="opt")
    session.run(
        "import contextlib\n"
        "for step in range(4):\n"
        "    opt.zero_grad()\n"
        "    # meant: no_sync for the micro-batches, then one synced backward; never synced here\n"
        "    with ddp.no_sync() if step >= 2 else contextlib.nullcontext():\n"
        "        ddp(torch.randn(16, 4)).sum().backward()\n"
        "    opt.step()\n"
    )
    report = session.diff_report("ddp").report
    assert report.first == 3, report  # the first step after an unsynced backward
    assert {d.name for d in report.differences} >= {"ddp.0.weight", "ddp.2.weight"}
    session.diff_stop("ddp")


def test_names_a_rank_lacks_and_bad_input(session: Session) -> None:
    from distnb.errors import ConfigError

    session.run("extra = {'w': torch.ones(2)} if rank == 0 else {}")
    view = session.diff("extra")
    assert view.report.missing == (("extra['w']", (1,)),)
    with pytest.raises(ConfigError, match="--atol"):
        session.diff("extra", atol=-1)
    with pytest.raises(ConfigError, match=r"this rank has no 'nothing_here'.*\(ranks 0-1\)"):
        session.diff("nothing_here")
    with pytest.raises(ConfigError, match=r"extra\.keys is a builtin_function_or_method"):
        session.diff("extra.keys")


def test_a_sharded_dtensor_has_nothing_to_compare(session: Session) -> None:
    session.run(
        "from torch.distributed.device_mesh import init_device_mesh\n"
        "from torch.distributed.tensor import distribute_tensor, Shard, Replicate\n"
        "mesh = init_device_mesh('cpu', (2,))\n"
        "torch.manual_seed(0)\n"
        "sharded = distribute_tensor(torch.randn(4, 4), mesh, [Shard(0)])\n"
        "copied = distribute_tensor(torch.randn(4, 4), mesh, [Replicate()])"
    )
    view = session.diff("sharded")
    assert view.agree and view.report.alone == 1 and "nothing to compare" in str(view)
    assert session.diff("copied").report.compared == 1
    session.run("if rank == 1:\n    copied.to_local()[0, 0] += 1")
    (d,) = session.diff("copied").report.differences
    assert d.agree == ((0,), (1,)) and d.max_abs == pytest.approx(1.0)


def test_the_magic_shows_the_same(session: Session, shell: object) -> None:
    from IPython.utils.capture import capture_output

    session.run("v = torch.ones(3) * (1 if rank == 0 else 2)")
    with capture_output() as out:
        shell.run_line_magic("dist_diff", "v")  # type: ignore[attr-defined]
    assert "replicas differ: 1 of 1" in out.stdout + str(out.outputs[0].data)


TRAIN = """\
for step in range(6):
    opt.zero_grad()
    ddp(torch.randn(16, 4)).sum().backward()
    opt.step()
    if step == 3 and rank == 1:  # a parameter changed outside DDP, on one rank
        with torch.no_grad():
            net[0].bias[0] += 1.0
"""


def test_a_watch_names_the_first_step_replicas_differed(session: Session, shell: object) -> None:
    from IPython.utils.capture import capture_output

    from distnb.errors import ConfigError

    session.run(DDP_MODEL)
    session.diff_watch("ddp", optim="opt")  # steps: opt.step(), digests after each
    session.run(TRAIN)
    report = session.diff_report("ddp").report
    assert report.steps == (1, 2, 3, 4, 5, 6) and report.first == 5
    assert [(d.name, d.agree) for d in report.differences] == [("ddp.0.bias", ((0,), (1,)))]
    with capture_output() as out:
        shell.run_line_magic("dist_diff", "ddp --report")  # type: ignore[attr-defined]
    assert "replicas of ddp first differ at step 5 (6 steps watched (1-6) on ranks 0-1)" in (
        str(out.outputs[0].data)
    )
    session.diff_stop("ddp")
    with pytest.raises(ConfigError, match="nothing watches 'ddp'"):
        session.diff_report("ddp")
    # every 2nd forward of the module, replicas that stay together
    session.run(DDP_MODEL)
    shell.run_line_magic("dist_diff", "ddp --watch --every 2")  # type: ignore[attr-defined]
    session.run(TRAIN.replace("step == 3", "step == 99"))
    view = session.diff_report("ddp")
    assert view.report.steps == (1, 3, 5) and view.report.first is None
    assert str(view).startswith("replicas of ddp agree at all 3 steps watched")
    session.diff_stop("ddp")


def test_a_watch_that_raises_stops_the_step_that_diverged(session: Session) -> None:
    from distnb.errors import RankError

    session.run(DDP_MODEL)
    session.diff_watch("ddp", optim="opt", raise_=True)
    started = time.monotonic()
    with pytest.raises(RankError) as info:
        session.run(TRAIN + "print('trained', rank)", timeout=60)
    took = time.monotonic() - started
    errors = {f.rank: f for f in info.value.failures}
    raised = [f for f in errors.values() if f.ename == "ReplicasDivergedError"]
    # the later rank to finish step 5 sees both records (or both do, if they post together) and
    # raises there; a peer that went on to step 6's all_reduce is released instead of hanging
    assert raised and set(errors) == {0, 1}, errors
    for f in raised:
        assert f.evalue.startswith("replicas of ddp differ at step 5: ddp.0.bias (0 | 1)")
    assert took < 30, took  # not the cell's 60 s timeout
    assert session.run("print('next', rank)").stdout(1) == "next 1\n"
    assert session.diff_report("ddp").report.first == 5  # the record goes on
    session.diff_stop("ddp")


SCRIPT = """\
import sys
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import distnb

torch.manual_seed(0)
model = DDP(nn.Linear(4, 2))
opt = torch.optim.SGD(model.parameters(), lr=float(sys.argv[1]) * (dist.get_rank() + 1))
model(torch.randn(8, 4)).sum().backward()
opt.step()
report = distnb.diff_replicas({"model": model, "opt": opt}, grads=True)
print(report.agree, [(d.name, d.agree) for d in report.differences])
print(f"{report.differences[0].max_abs:.6f}", report.compared, report.names)
print(f"{float(model.module.weight.grad.abs().max()) * float(sys.argv[1]):.6f}")
"""


def test_a_script_compares_its_replicas_with_the_public_function(
    session: Session, tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    result = session.run_script(str(tmp_path / "train.py"), "0.5")
    out = [result.stdout(r).splitlines() for r in (0, 1)]
    assert out[0] == out[1]  # every rank gets the same report
    names = ["model.weight", "model.bias", "opt.param_groups[0].lr"]
    expected = [(name, ((0,), (1,))) for name in names]
    assert out[0][0] == f"False {expected}"
    size, compared, targets = out[0][1].split(" ", 2)
    # the grads agree (DDP averaged them): rank 1's larger lr moved the weights by 0.5 * grad more
    assert size == out[0][2] and int(compared) >= 5 and targets == "('model, opt',)"
