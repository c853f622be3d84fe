"""Rendering overflow reports: text, HTML with the offending row marked, the widget."""

from __future__ import annotations

import math
from html.parser import HTMLParser

from distnb.records.overflow import Frame, Phase, RankOverflowReport
from distnb.views.overflow import OverflowView


def frame(order: int, name: str, **kw: object) -> Frame:
    base: dict[str, object] = {
        "step": 0,
        "micro": 0,
        "order": order,
        "module": "encoder.block.1.layer.1.DenseReluDense.wo",
        "cls": "Linear",
        "phase": Phase.FORWARD,
        "name": name,
        "dtype": "float16",
        "compute_dtype": "float16",
        "numel": 4096,
        "abs_min": 0.001,
        "abs_max": 30000.0,
        "min_nonzero": 0.001,
        "nan": 0,
        "inf": 0,
        "zeros": 0,
        "under": 0,
        "headroom_bits": 1.1,
    }
    return Frame(**{**base, **kw})  # type: ignore[arg-type]


def reports() -> list[RankOverflowReport]:
    warned = frame(1, "input[0]")
    bad = frame(2, "output", abs_max=math.inf, inf=7, headroom_bits=None, min_nonzero=None)
    r1 = RankOverflowReport(
        rank=1,
        steps=1,
        readbacks=1,
        first=bad,
        ring=(frame(0, "weight", abs_max=0.5, headroom_bits=17.0), warned, bad),
        headroom=(warned,),
    )
    late = frame(3, "weight.grad", step=1, phase=Phase.GRAD, abs_max=math.nan, nan=2)
    r0 = RankOverflowReport(rank=0, steps=2, readbacks=2, first=late, ring=(late,))
    return [r1, r0]


class Rows(HTMLParser):
    """Collects each table row's class attribute and cell texts."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[str, list[str]]] = []
        self.in_cell = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr":
            self.rows.append((dict(attrs).get("class") or "", []))
        self.in_cell = tag in ("td", "th")

    def handle_data(self, data: str) -> None:
        if self.in_cell and self.rows:
            self.rows[-1][1].append(data)


def test_html_marks_the_offending_row_and_the_headroom_row() -> None:
    view = OverflowView(reports())
    parser = Rows()
    parser.feed(view._repr_html_())
    marked = [(cls, cells[3]) for cls, cells in parser.rows if cls]
    # rank 0's table comes first (rank order); its only frame is its first non-finite one.
    assert marked[:3] == [
        ("distnb-nonfinite", "weight.grad"),
        ("distnb-headroom", "input[0]"),
        ("distnb-nonfinite", "output"),
    ]
    html = view._repr_html_()
    assert "rank 1 went non-finite first" in html and "background:#fff1f0" in html


def test_text_fallback() -> None:
    text = repr(OverflowView(reports()))
    lines = text.splitlines()
    assert lines[0].startswith("rank 1 went non-finite first: step 0, encoder.block.1.layer.1")
    assert "0 NaN, 7 Inf of 4096 values" in lines[0]
    assert "rank 0 received it later (likely through a collective): step 1" in text
    bad = next(line for line in lines if line.lstrip().startswith("!!") and "output" in line)
    assert "inf" in bad and "—" in bad  # no headroom for a non-finite frame
    assert any(line.lstrip().startswith("~") and "input[0]" in line for line in lines)


def test_widget_has_a_tab_per_rank_and_opens_on_the_first_rank() -> None:
    widget = OverflowView(reports()).widget()
    summary, tabs = widget.children
    assert "rank 1 went non-finite first" in summary.value
    assert [tabs.get_title(i) for i in range(2)] == ["rank 0 ⚠", "rank 1 ⚠"]
    assert tabs.selected_index == 1
    assert "distnb-nonfinite" in tabs.children[1].value
