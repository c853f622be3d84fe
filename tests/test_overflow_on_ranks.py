"""The overflow tracer driven from the notebook: `%dist_overflow` on a real 2-rank cluster."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from distnb.errors import RankError

pytestmark = pytest.mark.cluster

MODEL = """
torch.manual_seed(0)

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)
        self.poison = False

    def forward(self, x):
        h = self.a(x)
        if self.poison:
            h = h * float("inf")  # layer a's output goes inf on this rank only
        return self.b(torch.relu(h))

model = Net()

def step(poison):
    model.poison = poison
    model(torch.ones(2, 8)).sum().backward()
    for p in model.parameters():  # what DDP does: average the gradients
        dist.all_reduce(p.grad)
"""


def test_report_names_the_rank_that_went_non_finite_first(
    shell: object, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.run_cell_magic("allranks", "", MODEL)  # type: ignore[attr-defined]
    shell.run_line_magic("dist_overflow", "model --stats auto")  # type: ignore[attr-defined]
    shell.run_cell_magic("allranks", "", "step(False)\nstep(rank == 1)\nstep(False)")  # type: ignore[attr-defined]
    capsys.readouterr()
    shell.run_line_magic("dist_overflow", "--report")  # type: ignore[attr-defined]
    out = capsys.readouterr().out
    assert "rank 1" in out
    session = shell.magics_manager.registry["DistMagics"].session  # type: ignore[attr-defined]
    summary = session.overflow_report()["model"].summary
    assert summary.first_rank == 1
    assert 0 in summary.received
    first = summary.firsts[1]
    assert first is not None and first.phase.value == "forward"
    shell.run_line_magic("dist_overflow", "--detach model")  # type: ignore[attr-defined]
    with pytest.raises(UsageError, match="no overflow trace named 'model'"):
        shell.run_line_magic("dist_overflow", "--detach model")  # type: ignore[attr-defined]


def test_stop_at_the_first_non_finite_value_keeps_the_cluster(
    shell: object, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.run_cell_magic("allranks", "", MODEL)  # type: ignore[attr-defined]
    shell.run_line_magic("dist_overflow", "model --stop")  # type: ignore[attr-defined]
    with pytest.raises(RankError) as info:
        shell.run_cell_magic("allranks", "", "step(rank == 1)\nstep(False)")  # type: ignore[attr-defined]
    assert "NonFiniteError" in {f.ename for f in info.value.failures}
    capsys.readouterr()
    shell.run_cell_magic("allranks", "", "print('alive', rank)")  # type: ignore[attr-defined]
    assert "[rank 1] alive 1" in capsys.readouterr().out
