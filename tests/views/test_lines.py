"""A cell's output as lines: writes cut into lines, ranks' lines merged and collapsed (pure)."""

from __future__ import annotations

from collections.abc import Sequence

from distnb.views.lines import Group, Line, Merger, Splitter, Write, merge, split_lines


def lines(*texts: str, stream: str = "stdout") -> list[Line]:
    return [Line(stream, t) for t in texts]


def shown(groups: Sequence[Group]) -> str:
    return "".join(g.render() for g in groups)


def test_writes_become_lines_in_the_order_written_across_streams() -> None:
    writes = [
        Write("stdout", "a\n"),
        Write("stderr", "b\n"),
        Write("stdout", "c\nd"),  # d has no newline yet
        Write("stdout", "d\n"),
    ]
    assert split_lines(writes) == [
        Line("stdout", "a"),
        Line("stderr", "b"),
        Line("stdout", "c"),
        Line("stdout", "dd"),
    ]


def test_a_line_is_complete_at_its_newline_and_unfinished_lines_come_last() -> None:
    splitter = Splitter()
    assert splitter.feed([Write("stdout", "loss 0.5", at=1.0)]) == []
    assert splitter.peek() == [Line("stdout", "loss 0.5", 1.0)]
    assert splitter.feed([Write("stdout", "1\nnext", at=2.0)]) == [Line("stdout", "loss 0.51", 2.0)]
    assert splitter.tails() == [Line("stdout", "next", 2.0)]
    assert splitter.tails() == []  # taken: what follows starts a new line


def test_a_line_redrawn_in_place_shows_its_last_drawing() -> None:
    bar = "\r  0%|          | 0/5\r 40%|####      | 2/5\r100%|##########| 5/5\n"
    assert split_lines([Write("stderr", bar), Write("stdout", "windows\r\n")]) == [
        Line("stderr", "100%|##########| 5/5"),
        Line("stdout", "windows"),
    ]


def test_identical_lines_collapse_where_whole_outputs_differ() -> None:
    groups = merge({0: lines("hello", "bye 0"), 1: lines("hello", "bye 1")})
    assert shown(groups) == "[ranks 0-1] hello\n[rank 0] bye 0\n[rank 1] bye 1\n"


def test_a_loop_reads_step_by_step_with_shared_lines_once() -> None:
    out = {r: lines("step 0", f"loss {r}.0", "step 1", f"loss {r}.1", "done") for r in range(2)}
    assert shown(merge(out)) == (
        "[ranks 0-1] step 0\n[rank 0] loss 0.0\n[rank 1] loss 1.0\n"
        "[ranks 0-1] step 1\n[rank 0] loss 0.1\n[rank 1] loss 1.1\n[ranks 0-1] done\n"
    )


def test_a_rank_s_lines_of_its_own_stay_together() -> None:
    out = {
        0: lines("tensor([[0, 1],", "        [2, 3]])", "end"),
        1: lines("tensor([[4, 5],", "        [6, 7]])", "end"),
    }
    assert shown(merge(out)) == (
        "[rank 0] tensor([[0, 1],\n[rank 0]         [2, 3]])\n"
        "[rank 1] tensor([[4, 5],\n[rank 1]         [6, 7]])\n[ranks 0-1] end\n"
    )


def test_a_line_only_one_rank_printed_does_not_hide_the_shared_ones() -> None:
    out = {0: lines("header", "hello", "bye"), 1: lines("hello", "bye")}
    assert shown(merge(out)) == "[rank 0] header\n[ranks 0-1] hello\n[ranks 0-1] bye\n"


def test_ranks_that_agree_are_named_together_around_one_that_differs() -> None:
    out = {r: lines("epoch 1", "nan" if r == 2 else "ok") for r in range(4)}
    assert shown(merge(out)) == "[ranks 0-3] epoch 1\n[ranks 0-1,3] ok\n[rank 2] nan\n"


def test_the_same_text_on_different_streams_is_not_one_line() -> None:
    groups = merge({0: lines("x"), 1: lines("x", stream="stderr")})
    assert groups == [Group((0,), "stdout", "x"), Group((1,), "stderr", "x")]


def test_a_live_merge_waits_for_ranks_that_may_print_the_same_line() -> None:
    merger = Merger([0, 1])
    merger.add(0, [Line("stdout", "hello", at=10.0)])
    printing = {0, 1}

    def ready_at(now: float) -> object:
        return lambda line, quiet: now - line.at >= 0.3 or not set(quiet) & printing

    assert merger.take(ready_at(10.1)) == []  # rank 1 may still print hello
    merger.add(1, [Line("stdout", "hello", at=10.15)])
    assert merger.take(ready_at(10.2)) == [Group((0, 1), "stdout", "hello")]

    merger.add(0, [Line("stdout", "only 0", at=11.0)])
    assert merger.take(ready_at(11.1)) == []
    assert merger.take(ready_at(11.3)) == [Group((0,), "stdout", "only 0")]  # waited long enough
    printing.discard(1)  # rank 1's output is complete: nothing to wait for
    merger.add(0, [Line("stdout", "more", at=12.0)])
    assert merger.take(ready_at(12.0)) == [Group((0,), "stdout", "more")]
    assert not merger.pending()
