"""`ranks SELECTION COMMAND` at a debugger prompt: parsing, choosing the ranks, grouping answers
(the pure part, `distnb.session.debugger.many`; on real ranks: test_debug_many_ranks.py)."""

from __future__ import annotations

import pytest

from distnb.records.debug import InputRequest
from distnb.session.debugger.many import Selection, group_answers, parse, select


def stopped(*ranks: int, mesh: dict[int, dict[str, int]] | None = None) -> dict[int, InputRequest]:
    return {
        r: InputRequest(n=r, rank=r, run_id=1, prompt="(Pdb) ", mesh=(mesh or {}).get(r, {}))
        for r in ranks
    }


def test_parse_reads_all_lists_ranges_and_mesh_slices() -> None:
    assert parse("ranks all p loss") == (Selection(everyone=True), "p loss")
    assert parse("  ranks 0-3,6 p x.shape ") == (Selection(ranks=(0, 1, 2, 3, 6)), "p x.shape")
    assert parse("ranks dp=1,tp=0:4 c") == (Selection(mesh=(("dp", 1, 2), ("tp", 0, 4))), "c")
    assert parse("ranks") is None and parse("p ranks") is None and parse("rank 3") is None
    assert str(Selection(mesh=(("dp", 1, 2), ("tp", 0, 4)))) == "dp=1,tp=0:4"


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("ranks 3-1 p x", "'3-1': a range goes up (e.g. 0-3)"),
        ("ranks x1 p x", "'x1' is not a rank or a range of ranks"),
        ("ranks dp=one p x", "'dp=one' is not a mesh slice such as dp=1 or tp=0:4"),
        ("ranks tp=2:2 p x", "'tp=2:2': the slice is empty (stop is exclusive)"),
    ],
)
def test_a_selection_that_does_not_read_says_how_to_write_one(line: str, says: str) -> None:
    with pytest.raises(ValueError, match=r"e\.g\. `ranks all p loss`") as info:
        parse(line)
    assert says in str(info.value)


def test_select_takes_the_stopped_ranks_and_names_the_others() -> None:
    ranks = list(range(8))
    assert select(Selection(everyone=True), stopped(0, 1, 2), ranks) == ([0, 1, 2], "")
    assert select(Selection(ranks=(1, 2, 5, 6)), stopped(0, 1, 2), ranks) == (
        [1, 2],
        "ranks 5-6 not stopped",
    )
    assert select(Selection(ranks=(9,)), stopped(0), ranks) == (
        [],
        "no rank 9 in this run (it runs ranks 0-7)",
    )


def test_select_by_mesh_coordinates() -> None:
    mesh = {r: {"dp": r // 4, "tp": r % 4} for r in range(8)}
    every = stopped(*range(8), mesh=mesh)
    assert select(Selection(mesh=(("dp", 1, 2),)), every, list(range(8))) == ([4, 5, 6, 7], "")
    both = Selection(mesh=(("dp", 0, 2), ("tp", 0, 2)))
    assert select(both, every, list(range(8))) == ([0, 1, 4, 5], "")
    chosen, note = select(Selection(mesh=(("pp", 0, 1),)), every, list(range(8)))
    assert chosen == [] and note == "no mesh dimension pp: the mesh has dp, tp"
    chosen, note = select(Selection(mesh=(("dp", 0, 1),)), stopped(0, 1), [0, 1])
    assert chosen == [] and "select them by rank (`ranks 0-3 CMD`)" in note


def test_identical_answers_are_shown_once_labelled_by_their_ranks() -> None:
    answers = {r: "tensor(0.5000)\n" for r in range(8)} | {3: "tensor(nan)\n", 6: ""}
    assert group_answers(answers) == (
        "[ranks 0-2,4-5,7] tensor(0.5000)\n[rank 3] tensor(nan)\n[rank 6] (nothing printed)\n"
    )
    assert group_answers({0: "> a\n-> b\n", 1: "> a\n-> b\n"}) == (
        "[ranks 0-1] > a\n[ranks 0-1] -> b\n"
    )
