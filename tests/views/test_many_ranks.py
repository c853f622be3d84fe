"""32 ranks read like 2: each view and message groups the ranks that agree, from records.

From `GROUP_FROM` ranks on, ranks that made the same call, sit in the same state, hold the same
replicas, print or display the same thing or draw the same lane share one line; the odd one
out gets its own. Below it (8 ranks here), every rank keeps its own line, as before.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest
from IPython import get_ipython
from IPython.testing.globalipapp import start_ipython
from IPython.utils.capture import capture_output

from distnb.errors import RankTimeoutError
from distnb.judgement import match
from distnb.judgement.circles import held_up_by
from distnb.judgement.desync import desync_reason, skipped_call
from distnb.ranklist import GROUP_FROM, same_ranks
from distnb.records.beacon import Beacon, BeaconState, WaitKind
from distnb.records.cell import RankReport, RankState
from distnb.records.collective import CallSite, CollectiveEvent, Fingerprint, TensorSpec
from distnb.records.debug import DebugStop
from distnb.records.replicas import Digest, ReplicaReport, compare, first_divergence
from distnb.session.runs.endings import where_running
from distnb.views._format import DIFF_ROW_BG
from distnb.views.mismatch import MismatchView
from distnb.views.output import CellOutput, RankOutput
from distnb.views.replicas import ReplicaView, WatchView
from distnb.views.timeline import TimelineView
from distnb.views.timeline.layout import lanes, rank_groups
from distnb.views.timeline.model import build_timeline

MS = 1_000_000
HOSTS = {r: f"node{r // 8}" for r in range(32)}


def site(line: int) -> CallSite:
    return CallSite("train.py", line, code="dist.all_reduce(x)")


def fingerprint(rank: int, world: int, shape: tuple[int, ...], line: int = 41) -> Fingerprint:
    spec = (TensorSpec(shape, "float32"),)
    return Fingerprint(
        rank, "WORLD", 3, "all_reduce", spec, reduce_op="SUM", site=site(line),
        group_ranks=tuple(range(world)),
    )  # fmt: skip


def odd_shape(world: int, odd: int) -> list[Fingerprint]:
    """Every rank all_reduces float32[8] at line 41 but `odd`, which passes float32[4] at 44."""
    return [
        fingerprint(r, world, (4,) if r == odd else (8,), 44 if r == odd else 41)
        for r in range(world)
    ]


def test_same_ranks_keeps_the_order_of_each_first_rank() -> None:
    assert same_ranks([(3, "b"), (0, "a"), (5, "b")]) == [([3, 5], "b"), ([0], "a")]


def test_a_mismatch_of_32_ranks_is_a_line_for_the_many_and_one_for_the_odd_one() -> None:
    found = match(odd_shape(32, 16))
    assert found is not None and found.ranks == (16,)
    lines = found.message.splitlines()
    assert "(ranks 0-15,17-31: [8], rank 16: [4])" in lines[0]
    assert lines[1:3] == [
        "  ranks 0-15,17-31: all_reduce(float32[8], op=SUM)  at train.py:41: dist.all_reduce(x)",
        "  rank 16:          all_reduce(float32[4], op=SUM)  at train.py:44: dist.all_reduce(x)",
    ]
    assert len(lines) == 4  # the verdict, two lines of calls, "Nothing was sent"


def test_a_mismatch_of_8_ranks_keeps_a_line_per_rank() -> None:
    found = match(odd_shape(8, 2))
    assert found is not None
    lines = found.message.splitlines()
    assert "(rank 0: [8], rank 1: [8], rank 2: [4]," in lines[0]
    assert [line.split(":")[0] for line in lines[1:9]] == [f"  rank {r}" for r in range(8)]


def test_different_ops_at_32_ranks_say_who_calls_what_once() -> None:
    fps = [
        Fingerprint(r, "WORLD", 3, "broadcast" if r == 7 else "all_reduce", site=site(41),
                    group_ranks=tuple(range(32)))
        for r in range(32)
    ]  # fmt: skip
    found = match(fps)
    assert found is not None
    assert "ranks 0-6,8-31 call all_reduce, rank 7 calls broadcast" in found.message


def test_the_mismatch_table_of_32_ranks_has_a_row_for_the_odd_rank() -> None:
    found = match(odd_shape(32, 16))
    assert found is not None
    view = MismatchView(found)
    shown = view.shown()
    assert [(row[0], odd) for row, odd in shown] == [("0-15,17-31", False), ("16", True)]
    html = view._repr_html_()
    assert html.count("<tr") == 3 and html.count(f"background:{DIFF_ROW_BG}") == 1
    small = MismatchView(match(odd_shape(8, 2)))  # type: ignore[arg-type]
    assert [row[0] for row, _ in small.shown()] == [str(r) for r in range(8)]


def report(rank: int, odd: int) -> RankReport:
    if rank == odd:
        return RankReport(
            rank, RankState.RUNNING, "still running", "  cell In[3] line 9: sleep(60)"
        )
    stack = "  cell In[3] line 10: dist.all_reduce(x)"
    return RankReport(rank, RankState.RUNNING, f"waiting at all_reduce #3 for rank {odd}", stack)


def test_a_hang_report_of_32_ranks_names_the_rank_that_holds_the_others_up() -> None:
    err = RankTimeoutError("cell In[3] still running", [report(r, 16) for r in range(32)])
    lines = err._render_traceback_()
    assert lines[1:] == [
        "[ranks 0-15,17-31] running: waiting at all_reduce #3 for rank 16",
        "      cell In[3] line 10: dist.all_reduce(x)",
        "[rank 16] running: still running",
        "      cell In[3] line 9: sleep(60)",
    ]
    small = RankTimeoutError("cell In[3] still running", [report(r, 2) for r in range(8)])
    assert [line for line in small._render_traceback_() if line.startswith("[")] == [
        f"[rank {r}] running: " + ("still running" if r == 2 else "waiting at all_reduce #3 for "
                                   "rank 2")
        for r in range(8)
    ]  # fmt: skip


def test_an_interrupt_of_32_ranks_says_where_once_per_place() -> None:
    waits = {r: "waiting at all_reduce #3 for rank 5" for r in range(32) if r != 5}
    stacks = {5: "cell In[3] line 9: sleep(60)\n  more"}
    said = where_running("cell In[3]", list(range(32)), waits, stacks)
    assert said == (
        "cell In[3] interrupted: ranks 0-4,6-31 waiting at all_reduce #3 for rank 5; "
        "rank 5 cell In[3] line 9: sleep(60)"
    )
    eight = where_running("cell In[3]", list(range(8)), waits, stacks)
    assert eight.count("; ") == 7


def waiter(rank: int, missing: Sequence[int]) -> Beacon:
    return Beacon(
        rank, BeaconState.WAITING, 1, 0.0, kind=WaitKind.COLLECTIVE, group="WORLD",
        group_name="0", seq=3, op="all_reduce", site=site(41), waiting_for=tuple(missing),
    )  # fmt: skip


def test_a_desync_of_32_ranks_says_once_which_ranks_ended_alike() -> None:
    done = {r: "finished the cell" for r in range(16, 32)}
    reason = desync_reason(done, [waiter(r, range(16, 32)) for r in range(16)])
    assert reason.startswith(
        "ranks 16-31 finished the cell without calling all_reduce #3 on WORLD, which ranks "
        "0-15 wait at train.py:41"
    )
    small = desync_reason({3: "finished the cell"}, [waiter(r, [3]) for r in range(3)])
    assert small.startswith("rank 3 finished the cell without calling all_reduce #3")


def test_the_waiters_of_a_collective_wait_for_the_ranks_that_have_not_reached_it() -> None:
    # as seen on 10 ranks on 2 hosts: each beacon named whom it missed when it began to wait
    beacons = [waiter(0, range(1, 5)), waiter(1, range(2, 5)), waiter(3, [5, 7])]
    beacons += [waiter(r, [7]) for r in (2, 4, 5, 6, 8)] + [waiter(9, [5, 6, 7])]
    assert {held_up_by(b, beacons) for b in beacons} == {(7,)}
    assert held_up_by(waiter(0, [1]), [waiter(0, [1])]) == (1,)  # two ranks: as before


def test_where_32_ranks_stop_lining_up_names_each_call_site_once() -> None:
    events = [
        CollectiveEvent(r, "WORLD", 3, "all_reduce", 32, site(44 if r == 9 else 41), 0, 0, 0, 1, 32)
        for r in range(32)
    ]
    said = skipped_call(events)
    assert said.endswith("ranks 0-8,10-31 at train.py:41, rank 9 at train.py:44")


def replica_report(
    world: int, odd: int, names: Sequence[str] = ("fc.weight", "fc.bias")
) -> ReplicaReport:
    ranks = tuple(range(world))
    digests = [
        Digest(n, r, ranks, "b" if r == odd and n in names else "a", (4,), "float32", 16)
        for r in ranks
        for n in ("fc.weight", "fc.bias", "head")
    ]
    differences, missing, compared, alone = compare(digests, ranks)
    return ReplicaReport(("model",), ranks, compared, 16 * len(digests), tuple(differences),
                         tuple(missing), alone)  # fmt: skip


def test_the_replica_diff_of_32_ranks_says_who_differs_in_what() -> None:
    view = ReplicaView(replica_report(32, 31))
    text = str(view).splitlines()
    assert text[0].startswith("replicas differ: 2 of 3 tensors")
    assert text[1] == "ranks 0-30 agree; rank 31 differs in fc.weight, fc.bias"
    assert [row[:2] for row in view.rows()] == [
        ["fc.weight", "0-30 | 31"],
        ["fc.bias", "0-30 | 31"],
    ]
    html = view._repr_html_()
    assert "ranks 0-30 agree; rank 31 differs in fc.weight, fc.bias" in html


def test_ranks_that_differ_alike_share_a_part_and_long_lists_are_counted() -> None:
    ranks = tuple(range(32))
    names = [f"layer{i}" for i in range(5)]
    odd = {4: names, 9: names, 20: names[:1]}
    digests = [
        Digest(n, r, ranks, f"r{r}" if n in odd.get(r, ()) else "a") for r in ranks for n in names
    ]
    differences, missing, compared, alone = compare(digests, ranks)
    report = ReplicaReport(("m",), ranks, compared, 0, tuple(differences), tuple(missing), alone)
    assert ReplicaView(report).odd_ones() == (
        "ranks 0-3,5-8,10-19,21-31 agree; ranks 4,9 differ in layer0, layer1, layer2 and 2 more; "
        "rank 20 differs in layer0"
    )


def test_the_replica_diff_of_8_ranks_is_as_before() -> None:
    view = ReplicaView(replica_report(8, 7))
    assert str(view).splitlines()[1].split()[:2] == ["name", "ranks"]
    assert view.rows()[0][1] == "0,1,2,3,4,5,6 | 7"
    world = tuple(range(32))
    history = [[(0, [Digest("w", r, world, "b" if r == 31 else "a")])] for r in world]
    watch = first_divergence("w", world, history)
    assert WatchView(watch).rows() == [["w", "0-30 | 31"]]


def ev(
    rank: int, seq: int, arrive: int, line: int = 41, start: int | None = None
) -> CollectiveEvent:
    s = arrive if start is None else start
    return CollectiveEvent(rank, "WORLD", seq, "all_reduce", 1 << 20, site(line), arrive, s,
                           s + 100_000, 7, 32)  # fmt: skip


def busy(
    world: int, late: int | None = None, elsewhere: int | None = None, by: int = 3 * MS
) -> list[CollectiveEvent]:
    """Three all_reduces; `late` arrives `by` after the rest, `elsewhere` calls from line 44."""
    out = []
    for seq in range(3):
        # on time: within 31 µs, in an order that changes (ranks 9, 30, 19 last at 32 ranks)
        arrive = {r: seq * 10 * MS + (7 * r + 13 * seq) % world * 1000 for r in range(world)}
        if late is not None:
            arrive[late] += by
        start = max(arrive.values()) + 10_000
        out += [ev(r, seq, arrive[r], 44 if r == elsewhere else 41, start) for r in range(world)]
    return out


def test_timeline_lanes_of_32_ranks_are_hosts_with_the_late_and_the_odd_rank_alone() -> None:
    tl = build_timeline(busy(32, late=13, elsewhere=26), hosts=HOSTS)
    assert rank_groups(tl) == [
        tuple(range(8)), (8, 9, 10, 11, 12, 14, 15), (13,), tuple(range(16, 24)),
        (24, 25, 27, 28, 29, 30, 31), (26,),
    ]  # fmt: skip
    assert [lane.label for lane in lanes(tl)] == [
        "ranks 0-7 (node0)", "ranks 8-12,14-15 (node1)", "rank 13 (node1)", "ranks 16-23 (node2)",
        "ranks 24-25,27-31 (node3)", "rank 26 (node3)",
    ]  # fmt: skip
    assert [lane.label for lane in lanes(tl, ranks=[13])] == ["rank 13 (node1)"]


def test_ranks_on_one_host_share_a_lane_and_a_debugger_stop_keeps_its_own() -> None:
    stops = [DebugStop(5, 0, 2 * MS, 7)]
    tl = build_timeline(busy(32), stops=stops)
    assert rank_groups(tl) == [(0, 1, 2, 3, 4, *range(6, 32)), (5,)]


def test_a_rank_last_by_a_hair_every_time_has_a_lane_and_noise_does_not_split_lanes() -> None:
    tl = build_timeline(busy(32, late=20, by=40_000))  # 40 µs: under 2 pixels of 23 ms
    assert rank_groups(tl) == [(*range(20), *range(21, 32)), (20,)]
    noise = build_timeline(busy(32))  # ranks 9, 30 and 19 each last once, by 1 µs
    assert rank_groups(noise) == [tuple(range(32))]


def test_the_timeline_of_32_ranks_draws_and_tells_a_lane_per_group() -> None:
    view = TimelineView(busy(32, late=13), hosts=HOSTS)
    svg = view._repr_html_()
    labels = re.findall(r'text-anchor="end" fill="#333">([^<]*)<', svg)
    assert labels == [
        "ranks 0-7 (node0)", "ranks 8-12,14-15 (node1)", "rank 13 (node1)",
        "ranks 16-23 (node2)", "ranks 24-31 (node3)",
    ]  # fmt: skip
    # every lane but rank 13's waits at each collective, and the legend's
    assert svg.count('fill="url(#distnb-wait') == 3 * 4 + 1
    text = repr(view).splitlines()
    head = text.index("Lanes (ranks whose collectives agree share one; a late rank has its own):")
    assert text[head + 1].split()[:2] == ["lane", "ranks"]
    assert text[head + 4].split()[:5] == ["rank", "13", "(node1)", "1", "3"]
    fig = view.figure()
    ticks = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert ticks == labels


def test_the_timeline_widget_of_32_ranks_draws_lanes_and_details_a_row_per_lane() -> None:
    box = TimelineView(busy(32, late=13), hosts=HOSTS).widget()
    _heading, controls, drawing, _count, listing, detail, tables = box.children
    assert "ranks 8-12,14-15 (node1)" in drawing.value and "Lanes" in tables.value
    listing.index = 0
    rows = re.findall(r"<tr>(.*?)</tr>", detail.value.split("</thead>")[1])
    firsts = [re.sub("<[^>]+>", "", row.split("</td>")[0]) for row in rows]
    assert firsts == [
        "ranks 0-7", "ranks 8-12,14-15", "rank 13 (last)", "ranks 16-23", "ranks 24-31",
    ]  # fmt: skip
    controls.children[0].value = "13"  # one rank picked: its own lane
    assert "rank 13 (node1)" in drawing.value and "ranks 0-7" not in drawing.value


def test_the_timeline_of_8_ranks_keeps_a_lane_per_rank() -> None:
    view = TimelineView(busy(8, late=3))
    labels = re.findall(r'text-anchor="end" fill="#333">([^<]*)<', view._repr_html_())
    assert labels == [f"rank {r}" for r in range(8)]
    assert "Lanes" not in repr(view)


def test_32_ranks_that_display_the_same_show_it_once() -> None:
    shell = start_ipython() or get_ipython()  # None once started: another test may have
    assert shell is not None
    data = {"text/plain": "torch.Size([8])"}
    outs = [
        RankOutput(r, displays=[{"data": {"text/plain": "torch.Size([4])"} if r == 3 else data,
                                 "metadata": {}, "execution_count": r}])
        for r in range(32)
    ]  # fmt: skip
    with capture_output() as shown:
        CellOutput(list(range(32))).finish(outs)
    assert [o.data["text/plain"] for o in shown.outputs] == [
        "[ranks 0-2,4-31] torch.Size([8])",
        "[rank 3] torch.Size([4])",
    ]
    with capture_output() as shown:
        CellOutput(list(range(8))).finish(outs[:8])
    assert len(shown.outputs) == 8


@pytest.mark.parametrize("world", [GROUP_FROM - 1, GROUP_FROM])
def test_grouping_starts_at_group_from(world: int) -> None:
    found = match(odd_shape(world, 1))
    assert found is not None
    assert len(found.message.splitlines()) == (2 + world if world < GROUP_FROM else 4)
