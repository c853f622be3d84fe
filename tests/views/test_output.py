"""A cell's output where nobody watches it live (captured: tests, logs): printed once, merged,
each line on the stream its rank wrote it to; what was shown before a prompt is not repeated."""

from __future__ import annotations

import pytest

from distnb.views.lines import Write
from distnb.views.output import CellOutput, RankOutput


def output(rank: int, *writes: tuple[str, str] | Write) -> RankOutput:
    made = [w if isinstance(w, Write) else Write(*w) for w in writes]
    return RankOutput(rank, writes=made)


def test_lines_are_merged_at_the_end_on_their_own_streams(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cell = CellOutput([0, 1])
    assert not cell.live  # captured: nobody watches
    outs = [
        output(r, ("stdout", "hello\n"), ("stderr", f"warn {r}\n"), ("stdout", f"bye {r}"))
        for r in (0, 1)
    ]
    cell.update(outs, printing=[0, 1])
    assert capsys.readouterr() == ("", "")  # nothing before the end
    cell.finish(outs)
    captured = capsys.readouterr()
    assert captured.out == "[ranks 0-1] hello\n[rank 0] bye 0\n[rank 1] bye 1\n"
    assert captured.err == "[rank 0] warn 0\n[rank 1] warn 1\n"


def test_what_was_shown_before_a_prompt_is_not_shown_again(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cell = CellOutput([0, 1])
    first = [output(0, ("stdout", "> cell In[3] line 5\n-> y = x + 1")), output(1)]
    cell.progress(first)  # the line without its newline yet too
    assert capsys.readouterr().out == "[rank 0] > cell In[3] line 5\n[rank 0] -> y = x + 1\n"
    later = [output(0, *first[0].writes, ("stdout", "41\n")), output(1)]
    cell.finish(later)
    assert capsys.readouterr().out == "[rank 0] 41\n"


def test_output_made_from_whole_texts_keeps_both_streams() -> None:
    out = RankOutput(0, stdout="a\n", stderr="b\n")
    assert [(w.stream, w.text) for w in out.writes] == [("stdout", "a\n"), ("stderr", "b\n")]
