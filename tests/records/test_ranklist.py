"""The rank grammar of `--ranks`, the debugger's `ranks 0-3 CMD` and Python's `ranks=`: what it
reads, that it reads back whatever `format_ranks` prints, and what it says to bad text (pure,
milliseconds)."""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest

import distnb.ranklist
from distnb.ranklist import RankSelection, format_ranks, parse_ranks, rank_arg

EVERYONE = RankSelection(everyone=True)


def ranks(*rs: int) -> RankSelection:
    return RankSelection(ranks=rs)


@pytest.mark.parametrize(
    ("text", "selection"),
    [
        ("0-3,6", ranks(0, 1, 2, 3, 6)),
        ("0,2", ranks(0, 2)),
        ("0 2", ranks(0, 2)),
        (" 0 , 2 ", ranks(0, 2)),
        ("3", ranks(3)),
        ("2,0,1-2", ranks(0, 1, 2)),
        ("all", EVERYONE),
        ("ALL", EVERYONE),
        ("*", EVERYONE),
        ("all ranks", EVERYONE),
        ("rank 3", ranks(3)),
        ("ranks 0-2,5", ranks(0, 1, 2, 5)),
        ("[ranks 0-7]", ranks(*range(8))),
        ("dp=1", RankSelection(mesh=(("dp", 1, 2),))),
        ("dp=1,tp=0:4", RankSelection(mesh=(("dp", 1, 2), ("tp", 0, 4)))),
        ("ranks dp=1 tp=0:4", RankSelection(mesh=(("dp", 1, 2), ("tp", 0, 4)))),
    ],
)
def test_the_grammar_reads_lists_ranges_all_printed_ranks_and_mesh_slices(
    text: str, selection: RankSelection
) -> None:
    assert parse_ranks(text) == selection


def rank_sets() -> list[list[int]]:
    rng = random.Random(0)
    picked = [[0], [5], [0, 1], [0, 2], [0, 1, 2, 5], [3, 4, 7, 8, 9, 15], list(range(64))]
    return picked + [rng.sample(range(40), rng.randint(1, 40)) for _ in range(200)]


def test_whatever_format_ranks_prints_reads_back() -> None:
    for rs in rank_sets():
        printed = format_ranks(rs)
        assert parse_ranks(printed) == ranks(*sorted(set(rs))), printed
        assert parse_ranks(printed, world=max(rs) + 1).ranks == tuple(sorted(set(rs)))


@pytest.mark.parametrize("text", ["all", "rank 3", "ranks 0-2,5", "dp=1", "dp=1,tp=0:4"])
def test_a_selection_writes_itself_back(text: str) -> None:
    assert parse_ranks(str(parse_ranks(text))) == parse_ranks(text)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("0-", "'0-' is not a rank or a range of ranks: write ranks as 0-3,6, all, or a mesh"),
        ("x1", "'x1' is not a rank or a range of ranks"),
        ("0:4", "'0:4' is not a rank or a range of ranks"),
        ("3-1", "'3-1': a range goes up (e.g. 0-3); write 1-3"),
        ("-1", "'-1': a rank is 0 or more"),
        ("", "'' names no rank: write ranks as 0-3,6"),
        ("ranks", "'ranks' names no rank"),
        ("no rank", "'no rank' names no rank"),
        ("0,,2", "'0,,2' has a comma with no rank on one side"),
        ("0,", "'0,' has a comma with no rank on one side"),
        ("0,dp=1", "mixes ranks and a mesh slice: write 0-3,6 or dp=1,tp=0:4"),
        ("dp=one", "'dp=one' is not a mesh slice such as dp=1 or tp=0:4"),
        ("tp=2:2", "'tp=2:2': the slice is empty (stop is exclusive): tp=0:4 is tp 0 to 3"),
        ("dp=0,dp=1", "dp is sliced twice"),
    ],
)
def test_bad_text_says_what_to_write(text: str, says: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_ranks(text)
    assert says in str(info.value)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("4", "'4': no rank 4; the ranks are 0 to 3"),
        ("2-5", "'2-5': no rank 5; the ranks are 0 to 3"),
        ("-1", "'-1': a rank is 0 or more (the ranks are 0 to 3)"),
    ],
)
def test_given_the_world_size_ranks_past_the_last_name_the_allowed_range(
    text: str, says: str
) -> None:
    with pytest.raises(ValueError) as info:
        parse_ranks(text, world=4)
    assert says in str(info.value)
    assert parse_ranks("0-3", world=4) == ranks(0, 1, 2, 3)
    assert parse_ranks("all", world=4) == EVERYONE
    with pytest.raises(ValueError, match="no rank 1; the ranks are 0 alone"):
        parse_ranks("1", world=1)


def test_where_no_mesh_is_at_hand_a_mesh_slice_is_refused_with_the_alternative() -> None:
    with pytest.raises(ValueError) as info:
        parse_ranks("dp=1", mesh=False)
    assert "picks stopped ranks at a debugger prompt (`ranks dp=1 p x`)" in str(info.value)
    with pytest.raises(ValueError) as info:
        parse_ranks("x", mesh=False)
    assert str(info.value) == "'x' is not a rank or a range of ranks: write ranks as 0-3,6 or all"


def test_python_ranks_arguments_take_lists_or_the_same_text() -> None:
    assert rank_arg(None) is None
    assert rank_arg([2, 0]) == [2, 0]
    assert rank_arg((1,)) == [1]
    assert rank_arg("0-1,3") == [0, 1, 3]
    assert rank_arg("ranks 0-1") == [0, 1]
    assert rank_arg("all") is None and rank_arg("*") is None
    with pytest.raises(ValueError, match="a mesh slice"):
        rank_arg("dp=1")
    with pytest.raises(ValueError, match="no rank 2; the ranks are 0 to 1"):
        rank_arg("0-2", world=2)


def test_ranklist_is_a_leaf_module() -> None:
    tree = ast.parse(Path(distnb.ranklist.__file__).read_text())
    imported = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    ]
    assert not [m for m in imported if m and m.split(".")[0] in ("distnb", "torch")]
