"""Views of 32 ranks on 4 hosts as a browser draws them: ranks that agree read as one.

Status, shape table, timeline lanes, replica diff, a mismatch and a hang report.

Each view's HTML (what a notebook shows) is loaded in Chromium; the test reads what the page
shows and takes a screenshot of each (artifacts/scale/*.png). The records are built here, as
the views' own tests build them: the views are pure functions of records.
"""

from __future__ import annotations

import html
from typing import Any

import pytest

from distnb.errors import RankTimeoutError
from distnb.judgement import match
from distnb.records.cell import RankInfo, RankReport, RankState
from distnb.records.collective import CallSite, Fingerprint, TensorSpec
from distnb.records.replicas import Digest, ReplicaReport, compare
from distnb.records.resources import RankResources
from distnb.records.shapes import ShapeScan, TensorMeta
from distnb.views.mismatch import MismatchView
from distnb.views.replicas import ReplicaView
from distnb.views.shapes import ShapeTableView
from distnb.views.status import Status
from distnb.views.timeline import TimelineView
from harness.lab import REPO
from tests.views.test_timeline import ev

pytestmark = pytest.mark.browser

SHOTS = REPO / "artifacts" / "scale"
WORLD = 32


def status() -> Status:
    infos = tuple(
        RankInfo(
            r, r % 8, r, f"node{r // 8}", 1000 + r, f"cuda:{r % 8}", "nccl", f"10.0.0.{r // 8}"
        )
        for r in range(WORLD)
    )
    res = tuple(RankResources(r, (400 + r) << 20, 600 << 20, 4) for r in range(WORLD))
    states = tuple("was killed by the OOM killer" if r == 13 else "alive" for r in range(WORLD))
    return Status(infos, resources=res, states=states)


def shapes() -> ShapeTableView:
    def scan(r: int) -> ShapeScan:
        entries = tuple(
            TensorMeta(f"t{i}", (64, 65 if (r, i) == (17, 3) else 64), "float32", "cpu")
            for i in range(12)
        )
        return ShapeScan(r, entries)

    return ShapeTableView.from_scans([scan(r) for r in range(WORLD)])


def shot(page: Any, name: str, html: str) -> str:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.set_content(f"<html><body style='font-family:sans-serif'>{html}</body></html>")
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
    return str(page.inner_text("body"))


def test_status_of_32_ranks_reads_as_a_row_per_host_and_the_odd_rank(page: Any) -> None:
    text = shot(page, "status", status()._repr_html_())
    for h in range(4):
        assert f"node{h}" in text
    assert "0-7" in text and "cuda:0-7" in text and "8 pids" in text
    assert "12,14-15" in text and "was killed by the OOM killer" in text  # rank 13 alone
    assert page.locator("table").first.locator("tr").count() == 1 + 5  # header, 4 hosts + 13


def test_shape_table_of_32_ranks_has_a_column_for_the_odd_rank(page: Any) -> None:
    text = shot(page, "shapes", shapes()._repr_html_())
    assert "ranks 0-16,18-31 (cpu)" in text and "rank 17 (cpu)" in text
    assert page.locator("th").count() == 4


def test_timeline_of_32_ranks_draws_a_lane_per_rank(page: Any) -> None:
    ms = 1_000_000
    events = [
        ev(r, seq, seq * ms + r * 1000, start=seq * ms + WORLD * 1000, n=WORLD)
        for seq in range(3)
        for r in range(WORLD)
    ]
    text = shot(page, "timeline", TimelineView(events)._repr_html_())
    assert "rank 31" in text


def test_timeline_of_32_ranks_on_4_hosts_draws_a_lane_per_host_and_the_late_rank(
    page: Any,
) -> None:
    ms = 1_000_000
    events = []
    for seq in range(3):
        arrive = {r: seq * ms + r * 100 + (ms // 2 if r == 13 else 0) for r in range(WORLD)}
        start = max(arrive.values()) + 10_000
        events += [ev(r, seq, arrive[r], start=start, n=WORLD) for r in range(WORLD)]
    hosts = {r: f"node{r // 8}" for r in range(WORLD)}
    text = shot(page, "timeline-lanes", TimelineView(events, hosts=hosts)._repr_html_())
    for label in ("ranks 0-7 (node0)", "ranks 8-12,14-15 (node1)", "rank 13 (node1)"):
        assert label in text
    assert page.locator("svg text[text-anchor=end]").count() == 5  # 4 hosts and rank 13


def test_replica_diff_of_32_ranks_names_the_rank_that_differs(page: Any) -> None:
    ranks = tuple(range(WORLD))
    digests = [
        Digest(n, r, ranks, "b" if r == 31 and n != "head" else "a", (4,), "float32", 16)
        for r in ranks
        for n in ("fc.weight", "fc.bias", "head")
    ]
    differences, missing, compared, alone = compare(digests, ranks)
    report = ReplicaReport(
        ("model",), ranks, compared, 16 * len(digests), tuple(differences), tuple(missing), alone
    )
    text = shot(page, "replicas", ReplicaView(report)._repr_html_())
    assert "ranks 0-30 agree; rank 31 differs in fc.weight, fc.bias" in text
    assert "0-30 | 31" in text
    assert page.locator("tr").count() == 3  # header, fc.weight, fc.bias


def test_mismatch_and_hang_report_of_32_ranks_give_the_odd_rank_its_own_line(page: Any) -> None:
    def fingerprint(r: int) -> Fingerprint:
        odd = r == 16
        return Fingerprint(
            r, "WORLD", 3, "all_reduce", (TensorSpec((4 if odd else 8,), "float32"),),
            reduce_op="SUM", site=CallSite("train.py", 44 if odd else 41),
            group_ranks=tuple(range(WORLD)),
        )  # fmt: skip

    found = match([fingerprint(r) for r in range(WORLD)])
    assert found is not None
    reports = [
        RankReport(r, RankState.RUNNING, "still running", "  train.py line 40: load()")
        if r == 16
        else RankReport(
            r,
            RankState.RUNNING,
            "waiting at all_reduce #3 on WORLD for rank 16",
            "  train.py line 41: dist.all_reduce(x)",
        )
        for r in range(WORLD)
    ]
    hang = RankTimeoutError("train.py still running on ranks 0-31 after 60 s", reports)
    message = "\n".join([found.message, "", *hang._render_traceback_()])
    text = shot(
        page,
        "mismatch-hang",
        MismatchView(found)._repr_html_() + f"<pre>{html.escape(message)}</pre>",
    )
    assert "ranks 0-15,17-31: all_reduce(float32[8], op=SUM)" in text
    assert "rank 16:          all_reduce(float32[4], op=SUM)" in text
    assert "[ranks 0-15,17-31] running: waiting at all_reduce #3 on WORLD for rank 16" in text
    assert "[rank 16] running: still running" in text
    assert page.locator("tr").count() == 3  # header, the 31 ranks, rank 16
