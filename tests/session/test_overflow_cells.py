"""The overflow tracer driven from the notebook: `%dist_overflow` and `Session.overflow*` on a
real 2-rank gloo cluster. The tracer itself is tested in one process in tests/rank/."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from IPython.core.error import UsageError

from distnb.errors import ConfigError, RankError

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from distnb.session import Session

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
    shell: InteractiveShell, session: Session, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.run_cell_magic("allranks", "", MODEL)
    shell.run_line_magic("dist_overflow", "model --stats auto")
    shell.run_cell_magic("allranks", "", "step(False)\nstep(rank == 1)\nstep(False)")
    capsys.readouterr()
    shell.run_line_magic("dist_overflow", "--report")
    out = capsys.readouterr().out
    assert "rank 1 went non-finite first: step 1, b (Linear) forward input[0]" in out
    assert "auto statistics" in out
    summary = session.overflow_report()["model"].summary
    assert summary.first_rank == 1
    assert 0 in summary.received
    first = summary.firsts[1]
    assert first is not None and first.phase.value == "forward"
    shell.run_line_magic("dist_overflow", "--detach model")
    with pytest.raises(UsageError, match="no overflow trace named 'model'"):
        shell.run_line_magic("dist_overflow", "--detach model")


def test_bad_options_are_refused_in_the_kernel_before_any_rank_is_asked(
    shell: InteractiveShell, session: Session
) -> None:
    with pytest.raises(UsageError, match="stats must be one of 'fast', 'auto', 'full'"):
        shell.run_line_magic("dist_overflow", "model --stats everything")
    with pytest.raises(ConfigError, match="unknown overflow option"):
        session.overflow("model", stop=True)  # the magic's flag is --stop; the option is not


def test_stop_at_the_first_non_finite_value_keeps_the_cluster(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.run_cell_magic("allranks", "", MODEL)
    shell.run_line_magic("dist_overflow", "model --stop")
    with pytest.raises(RankError) as info:
        shell.run_cell_magic("allranks", "", "step(rank == 1)\nstep(False)")
    assert "NonFiniteError" in {f.ename for f in info.value.failures}
    capsys.readouterr()
    shell.run_cell_magic("allranks", "", "print('alive', rank)")
    assert "[rank 1] alive 1" in capsys.readouterr().out
