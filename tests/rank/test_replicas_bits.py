"""Replica checks on real ranks that differ by sign bits alone (issue 30): the previous digest, a
linear sum of words times weights, said "replicas agree" for each of these."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from distnb.session import Session

pytestmark = pytest.mark.cluster


def test_one_negated_element_of_four(session: Session) -> None:
    session.run("t = torch.tensor([1.0, 2.0, 3.0, 4.0])\nif rank == 1:\n    t[3] = -t[3]")
    view = session.diff("t")
    assert not view.agree, str(view)
    (d,) = view.report.differences
    assert d.name == "t" and d.agree == ((0,), (1,))
    assert d.max_abs == 8.0 and d.index == (3,)


def test_a_negated_weight_of_a_float64_linear(session: Session) -> None:
    session.run(
        "torch.manual_seed(0)\n"
        "lin = torch.nn.Linear(4, 3).double()\n"
        "with torch.no_grad():\n"
        "    if rank == 1:\n"
        "        lin.weight[0, 1] = -lin.weight[0, 1]"
    )
    view = session.diff("lin")
    assert [(d.name, d.agree) for d in view.report.differences] == [("lin.weight", ((0,), (1,)))], (
        str(view)
    )
    (d,) = view.report.differences
    w01 = float(session.run("print(lin.weight[0, 1].item())").stdout(0))
    assert d.index == (0, 1) and d.max_abs == pytest.approx(2 * abs(w01))


# SGD with momentum and lr=0: the parameters never move, and the first step's momentum buffer
# is the gradient itself, so replicas differ in one sign bit of the buffer and nowhere else
WATCHED = """\
torch.manual_seed(0)
net = torch.nn.Linear(4, 3).double()
opt = torch.optim.SGD(net.parameters(), lr=0.0, momentum=0.9)
"""
STEP = """\
opt.zero_grad()
net(torch.ones(2, 4, dtype=torch.float64)).sum().backward()
if rank == 1:  # a gradient hook gone wrong on one replica: one sign flipped
    net.weight.grad[0, 1] = -net.weight.grad[0, 1]
opt.step()
"""


def test_a_watch_that_raises_names_a_sign_flipped_gradient(session: Session) -> None:
    from distnb.errors import RankError

    session.run(WATCHED)
    session.diff_watch("net", optim="opt", raise_=True)
    try:
        with pytest.raises(RankError) as info:
            session.run(STEP, timeout=60)
        raised = [f for f in info.value.failures if f.ename == "ReplicasDivergedError"]
        assert raised, info.value.failures
        for f in raised:  # the later rank to reach step 1 (or both, if together)
            assert f.evalue.startswith(
                "replicas of net differ at step 1: opt.state[0].momentum_buffer (0 | 1)."
            ), f.evalue
        report = session.diff_report("net").report
        assert report.first == 1
        assert [(d.name, d.agree) for d in report.differences] == [
            ("opt.state[0].momentum_buffer", ((0,), (1,)))
        ]
    finally:
        session.diff_stop("net")
    assert session.diff("net").agree  # the parameters never moved
