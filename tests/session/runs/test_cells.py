"""Cells on a real 2-rank gloo cluster, through the Python API and through `%%allranks`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from distnb.errors import RankError, RankTimeoutError
from harness.processes import NAMED_S, interrupt_once_created, plain

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from distnb.session import Session


pytestmark = pytest.mark.cluster


class Runner:
    """Runs a cell through `session.run` or through `%%allranks`."""

    def __init__(self, how: str, session: Any, shell: Any) -> None:
        self.how, self.session, self.shell = how, session, shell
        # Under the magic, line 1 of the notebook cell is the `%%allranks` line.
        self.offset = 1 if how == "magic" else 0

    def __call__(self, code: str, line: str = "") -> object:
        if self.how == "python":
            return self.session.run(code, **_kwargs(line))
        return self.shell.run_cell_magic("allranks", line, code)


@pytest.fixture(params=["python", "magic"])
def run(request: pytest.FixtureRequest, session: Session, shell: InteractiveShell) -> Runner:
    """Every test taking `run` runs both ways: the Python API and the magic."""
    return Runner(request.param, session, shell)


def _kwargs(line: str) -> dict[str, object]:
    words = line.split()
    kw: dict[str, object] = {}
    for flag, value in zip(words[::2], words[1::2], strict=False):
        if flag == "--timeout":
            kw["timeout"] = float(value)
        if flag == "--ranks":
            kw["ranks"] = [int(r) for r in value.split(",")]
    return kw


@pytest.mark.check
def test_all_reduce_output_is_labelled_in_rank_order(
    run: Runner, capsys: pytest.CaptureFixture[str]
) -> None:
    run("x = torch.ones(3) * (rank + 1)\ndist.all_reduce(x)\nprint(rank, world_size, x.tolist())")
    out = capsys.readouterr().out
    assert "[rank 0] 0 2 [3.0, 3.0, 3.0]\n[rank 1] 1 2 [3.0, 3.0, 3.0]\n" in out


def test_identical_output_is_collapsed_and_stderr_kept(
    run: Runner, capsys: pytest.CaptureFixture[str]
) -> None:
    run("import sys\nprint('same')\nprint('warn', rank, file=sys.stderr)")
    captured = capsys.readouterr()
    assert "[ranks 0-1] same\n" in captured.out
    assert "[rank 0] warn 0\n[rank 1] warn 1\n" in captured.err


def test_namespace_holds_the_rank_names(run: Runner, capsys: pytest.CaptureFixture[str]) -> None:
    run("print(rank, world_size, local_rank, device, torch.__name__, dist.get_rank())")
    out = capsys.readouterr().out
    assert "[rank 1] 1 2 1 cpu torch 1" in out


def test_ranks_option_runs_on_a_subset(run: Runner, capsys: pytest.CaptureFixture[str]) -> None:
    run("print('only', rank)", "--ranks 1")
    out = capsys.readouterr().out
    assert "[rank 1] only 1" in out and "[rank 0]" not in out


def test_errors_show_each_rank_traceback_with_cell_lines(run: Runner) -> None:
    with pytest.raises(RankError) as info:
        run("x = 1\nif rank == 1:\n    raise ValueError(f'bad input on {rank}')\n")
    err = info.value
    assert type(err) is RankError
    assert [f.rank for f in err.failures] == [1]
    text = plain("\n".join(err._render_traceback_()))
    assert "[rank 1] ValueError: bad input on 1" in text
    assert f"line {3 + run.offset}" in text and "raise ValueError" in text


def test_identical_errors_collapse(run: Runner) -> None:
    with pytest.raises(RankError) as info:
        run("import math\nmath.sqrt(-1)")
    text = plain("\n".join(info.value._render_traceback_()))
    assert "[ranks 0-1] ValueError: math domain error" in text
    assert text.count("Traceback") == 1


def test_timeout_gives_a_hang_report_and_the_cluster_stays_usable(
    run: Runner, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(RankTimeoutError) as info:
        run("import time\nif rank == 1:\n    time.sleep(60)\n", "--timeout 1")
    err = info.value
    states = {r.rank: r.state.value for r in err.reports}
    assert states == {0: "finished", 1: "running"}
    stack = err.reports[1].stack
    assert f"line {3 + run.offset}: time.sleep(60)" in stack.splitlines()[0]
    assert "interrupted; the cluster is ready" in err.message
    capsys.readouterr()
    run("print('after', rank)")
    assert "[rank 1] after 1" in capsys.readouterr().out


def test_last_expression_is_kept_per_rank(session: Session) -> None:
    result = session.run("rank * 10")
    assert result.result(0) == "0" and result.result(1) == "10"


def test_ctrl_c_interrupts_the_ranks_and_keeps_the_cluster(
    session: Session, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "sleeping"
    code = (
        f"import time, pathlib\npathlib.Path({str(marker)!r} + str(rank)).touch()\ntime.sleep(600)"
    )

    thread = interrupt_once_created(marker, ranks=(0, 1))
    with pytest.raises(KeyboardInterrupt):
        session.run(code)
    thread.join()
    assert thread.sent is not None and time.monotonic() - thread.sent < NAMED_S
    capsys.readouterr()
    session.run("print('still here', rank)")
    assert "[rank 0] still here 0" in capsys.readouterr().out


@pytest.mark.check
def test_ctrl_c_at_any_moment_of_a_busy_cell_leaves_a_working_kernel(
    session: Session, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The ranks print as fast as they can, so that ipyparallel's I/O thread takes its locks
    all the time, and Ctrl-C comes at a different moment of the kernel's wait each round: each
    is one KeyboardInterrupt, and the next cell runs (a KeyboardInterrupt raised inside a lock
    the I/O thread also takes once left it held and the kernel hung for good)."""
    marker = tmp_path / "printing"
    code = (
        f"import pathlib\npathlib.Path({str(marker)!r} + str(rank)).touch()\n"
        "while True:\n    print(rank, 'x' * 60)"
    )
    for round_ in range(8):
        for r in (0, 1):
            Path(f"{marker}{r}").unlink(missing_ok=True)
        thread = interrupt_once_created(marker, ranks=(0, 1), after_s=0.013 * round_)
        with pytest.raises(KeyboardInterrupt):
            session.run(code)
        thread.join()
        capsys.readouterr()
        assert session.run("rank + 1").result(1) == "2", f"round {round_}"


def test_cells_leave_nothing_behind_in_the_kernel_s_client(session: Session) -> None:
    """ipyparallel clears a request's reply and output, but keeps its id in the client's
    history for ever; distnb drops the ids of its finished requests (cells, calls, probes),
    so a long session does not grow per cell there."""
    client = session.cluster.client
    session.run("x = 1")
    before = len(client.history)
    for _ in range(5):
        session.run("print(rank)")
        session.call(abs, -1)
    session.status()
    assert len(client.history) == before
    assert not client.results and not client.outstanding
