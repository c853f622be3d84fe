"""A cell's output around prompts, without a kernel (terminal IPython, scripts): what was shown
before a prompt is not printed again, and what a command to several ranks took is theirs.
(In a kernel: tests/session/test_debug_transcript.py, through a real kernel.)"""

from __future__ import annotations

import pytest

from distnb.views.output import CellOutput, RankOutput


def test_progress_take_and_finish_print_each_part_once(capsys: pytest.CaptureFixture[str]) -> None:
    out = CellOutput([0, 1])
    assert not out.live
    out.progress([RankOutput(0, "a\n"), RankOutput(1, "stop at 5\n")])
    assert capsys.readouterr().out == "[rank 0] a\n[rank 1] stop at 5\n"
    later = [RankOutput(0, "a\nb\n"), RankOutput(1, "stop at 5\ntensor([2.])\n", "warn\n")]
    assert out.take(later, {1: (99, 99), 0: (4, 0)}) == {1: "tensor([2.])\nwarn\n", 0: "b\n"}
    assert capsys.readouterr().out == ""  # taken, for the caller to show
    out.finish(
        [RankOutput(0, "a\nb\nc\n"), RankOutput(1, "stop at 5\ntensor([2.])\nd\n", "warn\n")]
    )
    assert capsys.readouterr().out == "[rank 0] c\n[rank 1] d\n"


def test_take_never_passes_what_has_arrived() -> None:
    out = CellOutput([0])
    assert out.take([RankOutput(0, "ab")], {0: (10, 0)}) == {0: "ab"}
    assert out.take([RankOutput(0, "abcd")], {0: (10, 0)}) == {0: "cd"}
