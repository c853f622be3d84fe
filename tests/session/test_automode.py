"""Auto mode on a real IPython shell and a real 2-rank cluster: `%dist_auto` and `s.auto()`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from IPython.core.error import UsageError

from distnb.errors import RankError
from distnb.session.automode import AutoMode, Route, route
from harness.processes import plain

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from distnb.session import Session


@pytest.mark.parametrize(
    ("cell", "where"),
    [
        ("x = 1\n", Route.RANKS),
        ("\n\nprint(rank)\n", Route.RANKS),
        ("%matplotlib inline\nx = 1\n", Route.RANKS),  # the ranks' IPython runs line magics
        ("%%local\nx = 1\n", Route.LOCAL),
        ("%%allranks --ranks 0\nx = 1\n", Route.KERNEL),
        ("%%time\nx = 1\n", Route.KERNEL),
        ("%dist_auto off\n", Route.KERNEL),
        ("%dist_status\n", Route.KERNEL),
        ("%load_ext distnb\n", Route.KERNEL),
        ("exit\n", Route.KERNEL),
        ("quit()\n", Route.KERNEL),
        ("exit_code = 3\n", Route.RANKS),
        ("%%localize\n", Route.KERNEL),
        ("", Route.KERNEL),
    ],
)
def test_route_sends_code_to_the_ranks_and_controls_to_the_kernel(cell: str, where: Route) -> None:
    assert route(cell.splitlines(keepends=True)) is where


cluster = pytest.mark.cluster  # the tests below start real engines (route's do not)


class Auto:
    """Turns auto mode on and off through the magic or through `session.auto`."""

    def __init__(self, how: str, session: Session, shell: InteractiveShell) -> None:
        self.how, self.session, self.shell = how, session, shell

    def on(self, line: str = "") -> None:
        if self.how == "magic":
            self.shell.run_line_magic("dist_auto", f"on {line}")
        else:
            ranks = [int(r) for r in line.split()[1].split(",")] if "--ranks" in line else None
            self.session.auto(True, ranks=ranks)

    def off(self) -> None:
        if self.how == "magic":
            self.shell.run_line_magic("dist_auto", "off")
        else:
            self.session.auto(False)


@pytest.fixture(params=["python", "magic"])
def auto(
    request: pytest.FixtureRequest, session: Session, shell: InteractiveShell
) -> Iterator[Auto]:
    switch = Auto(request.param, session, shell)
    yield switch
    mode = AutoMode.find(shell)
    if mode is not None:
        mode.disable()


def run_cell(shell: InteractiveShell, code: str) -> None:
    """Run a cell as IPython does for typed input; raise what it raised."""
    shell.run_cell(code, store_history=True).raise_error()


@cluster
def test_cells_run_on_the_ranks_until_auto_mode_is_off(
    auto: Auto, shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.user_ns.pop("on_ranks", None)
    auto.on()
    assert "auto mode on: every cell runs on ranks 0-1" in capsys.readouterr().out
    run_cell(shell, "on_ranks = rank * 10\nprint('value', on_ranks)")
    out = capsys.readouterr().out
    assert "[rank 0] value 0" in out and "[rank 1] value 10" in out
    assert "on_ranks" not in shell.user_ns
    run_cell(shell, "%%local\nhere = 'kernel'\nprint('ran in the', here)")
    assert capsys.readouterr().out == "ran in the kernel\n"
    assert shell.user_ns["here"] == "kernel"
    auto.off()
    assert "auto mode off" in capsys.readouterr().out
    run_cell(shell, "print('back in the', here)")
    assert capsys.readouterr().out == "back in the kernel\n"


@cluster
def test_tracebacks_count_the_cells_own_lines(auto: Auto, shell: InteractiveShell) -> None:
    auto.on("--ranks 1")
    with pytest.raises(RankError) as info:
        run_cell(shell, "x = 1\nraise ValueError(f'no {rank}')")
    text = plain("\n".join(info.value._render_traceback_()))
    assert "[rank 1] ValueError: no 1" in text and "[rank 0]" not in text
    assert "line 2" in text and "line 3" not in text


@cluster
def test_the_terminal_prompt_says_where_cells_run(auto: Auto, shell: InteractiveShell) -> None:
    if not hasattr(shell, "prompts"):
        pytest.skip("not a terminal shell")
    before = shell.prompts
    auto.on("--ranks 0")
    tokens = "".join(text for _, text in shell.prompts.in_prompt_tokens())
    assert tokens.startswith("[rank 0] ") and "In [" in tokens
    auto.off()
    assert shell.prompts is before


@cluster
def test_magics_and_multiline_input_stay_in_the_kernel(
    auto: Auto, shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    auto.on()
    status = shell.run_cell("%dist_status").result
    assert [r.rank for r in status.ranks] == [0, 1]
    # Enter in a terminal asks whether the cell is complete: the question is about the cell
    # as typed, not about the one-line call auto mode makes of it.
    assert shell.check_complete("for i in range(3):")[0] == "incomplete"
    run_cell(shell, "%%allranks --ranks 1\nprint('allranks', rank)")
    assert "[rank 1] allranks 1" in capsys.readouterr().out


@cluster
def test_bad_auto_arguments(shell: InteractiveShell, session: Session) -> None:
    with pytest.raises(UsageError, match="ranks \\[7\\] are not in this session"):
        shell.run_line_magic("dist_auto", "on --ranks 7")
    with pytest.raises(UsageError, match="Usage: %dist_auto"):
        shell.run_line_magic("dist_auto", "maybe")
    assert not AutoMode.find(shell) or not AutoMode.find(shell).active  # type: ignore[union-attr]


@cluster
def test_auto_mode_ends_with_its_session(shell: InteractiveShell) -> None:
    import distnb

    with distnb.start(2, progress=False) as own:
        own.auto()
    with pytest.raises(UsageError, match="auto mode ended, since its session has stopped"):
        run_cell(shell, "print('nowhere')")
    mode = AutoMode.find(shell)
    assert mode is not None and not mode.active
    run_cell(shell, "kernel_again = 1")
    assert shell.user_ns["kernel_again"] == 1


@cluster
def test_local_runs_in_the_kernel_without_auto_mode_too(shell: InteractiveShell) -> None:
    from distnb.magics import DistMagics

    magics = next(m for m in shell.magics_manager.registry.values() if isinstance(m, DistMagics))
    magics.local("", "from_local = 'kernel'")  # the magic itself, as before auto mode existed
    assert shell.user_ns["from_local"] == "kernel"
