"""A cell's output around prompts, without a kernel (terminal IPython, scripts): what was shown
before a prompt is not printed again, and what a command to several ranks took is theirs.
(In a kernel: tests/session/debugger/test_debug_transcript.py, through a real kernel.)"""

from __future__ import annotations

import pytest

from distnb.views.lines import Write
from distnb.views.output import CellOutput, RankOutput


def test_progress_take_and_finish_print_each_part_once(capsys: pytest.CaptureFixture[str]) -> None:
    out = CellOutput([0, 1])
    assert not out.live
    w0, w1 = [Write("stdout", "a\n")], [Write("stdout", "stop at 5\n")]
    out.progress([RankOutput(0, writes=w0), RankOutput(1, writes=w1)])
    assert capsys.readouterr().out == "[rank 0] a\n[rank 1] stop at 5\n"
    w0.append(Write("stdout", "b\n"))
    w1 += [Write("stdout", "tensor([2.])\n"), Write("stderr", "warn\n")]
    later = [RankOutput(0, writes=w0), RankOutput(1, writes=w1)]
    assert out.take(later, [1, 0]) == {1: "tensor([2.])\nwarn\n", 0: "b\n"}
    assert capsys.readouterr().out == ""  # taken, for the caller to show
    w0.append(Write("stdout", "c\n"))
    w1.append(Write("stdout", "d\n"))
    out.finish([RankOutput(0, writes=w0), RankOutput(1, writes=w1)])
    assert capsys.readouterr().out == "[rank 0] c\n[rank 1] d\n"


def test_take_gives_what_has_arrived_once() -> None:
    out = CellOutput([0])
    writes = [Write("stdout", "ab")]
    assert out.take([RankOutput(0, writes=writes)], [0]) == {0: "ab"}
    writes.append(Write("stdout", "cd"))
    assert out.take([RankOutput(0, writes=writes)], [0]) == {0: "cd"}
