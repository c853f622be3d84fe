"""Views of 32 ranks on 4 hosts as a browser draws them: ranks that agree read as one.

Each view's HTML (what a notebook shows) is loaded in Chromium; the test reads what the page
shows and takes a screenshot of each (artifacts/scale/*.png). The records are built here, as
the views' own tests build them: the views are pure functions of records.
"""

from __future__ import annotations

from typing import Any

from distnb.records.cell import RankInfo
from distnb.records.resources import RankResources
from distnb.records.shapes import ShapeScan, TensorMeta
from distnb.views.shapes import ShapeTableView
from distnb.views.status import Status
from distnb.views.timeline import TimelineView
from tests.browser.lab import REPO
from tests.views.test_timeline import ev

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
