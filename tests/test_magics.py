"""The magics on a real IPython shell: lifecycle, and every bad input answered with the fix."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from IPython.core.error import UsageError

import distnb
from distnb.errors import ConfigError
from distnb.magics import DistMagics
from harness.processes import running_pids

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell


pytestmark = pytest.mark.cluster


@pytest.fixture
def magics(shell: InteractiveShell) -> Iterator[DistMagics]:
    registry = shell.magics_manager.registry
    yield next(m for m in registry.values() if isinstance(m, DistMagics))


@pytest.fixture
def no_session(magics: DistMagics) -> Iterator[DistMagics]:
    saved, magics.session = magics.session, None
    yield magics
    magics.session = saved


@pytest.mark.check
def test_loading_twice_registers_one_set_of_magics(shell: InteractiveShell) -> None:
    shell.run_line_magic("load_ext", "distnb")
    distnb.load_ipython_extension(shell)
    registry = shell.magics_manager.registry
    assert sum(isinstance(m, DistMagics) for m in registry.values()) == 1


def test_magic_lifecycle_start_status_run_restart_stop(
    shell: InteractiveShell, no_session: DistMagics, capsys: pytest.CaptureFixture[str]
) -> None:
    status = shell.run_line_magic("dist_start", "-n 2 --backend gloo --timeout 30 --no-check")
    try:
        assert [r.rank for r in status.ranks] == [0, 1]
        assert "backend" in repr(status) and "<table" in status._repr_html_()
        assert no_session.session is not None and no_session.session.options.timeout == 30
        shell.run_cell_magic(
            "allranks",
            "",
            "import distnb.rank.checked as c\nprint(dist.get_world_size(), c.installed())",
        )
        assert "[ranks 0-1] 2 False" in capsys.readouterr().out  # --no-check
        before = no_session.session.pids()
        shell.run_line_magic("dist_restart", "")
        assert not running_pids(before)
        assert len(shell.run_line_magic("dist_status", "").ranks) == 2
    finally:
        pids = no_session.session.pids() if no_session.session else []
        shell.run_line_magic("dist_stop", "")
    assert not running_pids(pids)
    assert "no cluster running" in repr(shell.run_line_magic("dist_status", ""))


@pytest.mark.parametrize(
    ("line", "fix"),
    [
        ("-n 0", "-n must be at least 1"),
        ("-n abc", "-n takes a whole number"),
        ("--backend nccl", "--backend gloo"),
        ("--backend mpi", "backend must be one of auto, gloo, nccl"),
        ("--timeout -1", "--timeout must be > 0"),
        ("--frobnicate", "Usage: %dist_start"),
    ],
)
@pytest.mark.check
def test_bad_start_arguments_say_the_fix_and_start_nothing(
    shell: InteractiveShell, no_session: DistMagics, line: str, fix: str
) -> None:
    with pytest.raises(UsageError, match=fix):
        shell.run_line_magic("dist_start", line)
    assert no_session.session is None or not no_session.session.running


@pytest.mark.check
def test_allranks_before_start_says_how_to_start(
    shell: InteractiveShell, no_session: DistMagics
) -> None:
    with pytest.raises(UsageError, match="%dist_start -n 2"):
        shell.run_cell_magic("allranks", "", "print(rank)")


@pytest.mark.parametrize(
    ("magic", "line", "fix"),
    [
        ("dist_start", "-n 2", "already running: use it, or %dist_restart / %dist_stop"),
        ("allranks", "--ranks 7", r"ranks \[7\] are not in this session, which has ranks 0-1"),
        ("allranks", "--ranks x", "--ranks: 'x' is not a rank or a range of ranks: write ranks as"),
        ("allranks", "--ranks 1-0", "--ranks: '1-0': a range goes up"),
        ("allranks", "--ranks 0-", "write ranks as 0-3,6 or all"),
        ("allranks", "--ranks dp=1", "--ranks: 'dp=1' is a mesh slice"),
        ("dist_pull", "x --ranks x", "--ranks: 'x' is not a rank"),
        ("dist_auto", "on --ranks 0-", "--ranks: '0-' is not a rank"),
        ("allranks", "--timeout -1", "--timeout must be > 0"),
        ("allranks", "--bogus", "Usage: %allranks"),
    ],
)
@pytest.mark.check
def test_bad_input_leaves_the_running_cluster_untouched(
    shell: InteractiveShell,
    magics: DistMagics,
    magic: str,
    line: str,
    fix: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert magics.session is not None
    before = magics.session.pids()
    with pytest.raises(UsageError, match=fix):
        if magic == "allranks":
            shell.run_cell_magic(magic, line, "print(rank)")
        else:
            shell.run_line_magic(magic, line)
    assert magics.session.pids() == before
    shell.run_cell_magic("allranks", "", "print('fine')")
    assert "[ranks 0-1] fine" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("line", "label"),
    [
        ("--ranks 0-1", "[ranks 0-1]"),
        ('--ranks "ranks 0-1"', "[ranks 0-1]"),
        ("--ranks 'rank 1'", "[rank 1]"),
        ("--ranks 1", "[rank 1]"),
        ("--ranks all", "[ranks 0-1]"),
    ],
)
def test_ranks_reads_what_distnb_prints(
    shell: InteractiveShell, line: str, label: str, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.run_cell_magic("allranks", line, "print('here')")
    out = capsys.readouterr().out
    assert f"{label} here" in out and out.count("here") == 1


def test_python_ranks_take_the_same_text(
    magics: DistMagics, capsys: pytest.CaptureFixture[str]
) -> None:
    session = magics.session
    assert session is not None
    assert [o.rank for o in session.run("print('py')", ranks="rank 1").outputs] == [1]
    assert "[rank 1] py" in capsys.readouterr().out
    assert session.call(int, "7", ranks="0-1") == [7, 7]
    assert [t.rank for t in session.targets("ranks 0-1")] == [0, 1]
    with pytest.raises(ConfigError, match="'0-' is not a rank or a range of ranks: write ranks as"):
        session.run("print('never')", ranks="0-")
    with pytest.raises(ConfigError, match=r"ranks \[5\] are not in this session"):
        session.targets("5")
