"""What real ranks print reaches the kernel as they wrote it: stdout and stderr in the order
written, warnings at the cell's line, identical lines collapsed where whole outputs differ."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from distnb.views.lines import Line, split_lines

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from distnb.session import Session

pytestmark = pytest.mark.cluster


def test_stdout_and_stderr_come_in_the_order_written(session: Session) -> None:
    # a loop switching streams, without flushes: ipykernel buffers each stream on its own
    code = (
        "import sys\n"
        "for i in range(3):\n"
        "    print('out', i, rank)\n"
        "    print('err', i, rank, file=sys.stderr)\n"
        "print('end', rank)"
    )
    result = session.run(code)
    for out in result.outputs:
        r = out.rank
        expected = [Line(s, f"{s[3:]} {i} {r}") for i in range(3) for s in ("stdout", "stderr")]
        got = [Line(line.stream, line.text) for line in split_lines(out.writes)]
        assert got == [*expected, Line("stdout", f"end {r}")]
        assert out.stdout == "".join(f"out {i} {r}\n" for i in range(3)) + f"end {r}\n"


def test_warnings_name_the_cell_line(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    cell = shell.execution_count  # the number the notebook shows for the running cell
    shell.run_cell_magic("allranks", "", "import warnings\nx = 1\nwarnings.warn('careful')")
    # line 4 of the notebook cell: line 1 is `%%allranks`
    assert capsys.readouterr().err == (
        f"[ranks 0-1] cell In[{cell}] line 4: UserWarning: careful\n"
        "[ranks 0-1]   warnings.warn('careful')\n"
    )


def test_identical_lines_collapse_where_whole_outputs_differ(
    session: Session, capsys: pytest.CaptureFixture[str]
) -> None:
    session.run("print('hello')\nprint('bye', rank)\nprint('done')")
    assert capsys.readouterr().out == (
        "[ranks 0-1] hello\n[rank 0] bye 0\n[rank 1] bye 1\n[ranks 0-1] done\n"
    )
