"""The shared table helpers, and the small views built on them (pure, milliseconds)."""

from __future__ import annotations

from html.parser import HTMLParser

from distnb.records.cell import RankInfo
from distnb.records.collective import CallSite, Fingerprint, MatchKind, Mismatch, TensorSpec
from distnb.views._format import (
    CELL_STYLE,
    DIFF_ROW_BG,
    Cell,
    Row,
    html_block,
    html_table,
    text_table,
)
from distnb.views.mismatch import MismatchView
from distnb.views.status import Status


class Table(HTMLParser):
    """Each row's attributes and its cells' (attributes, text)."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.rows: list[tuple[dict[str, str | None], list[tuple[dict[str, str | None], str]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "tr":
            self.rows.append((dict(attrs), []))
        elif tag in ("td", "th"):
            self.rows[-1][1].append((dict(attrs), ""))

    def handle_data(self, data: str) -> None:
        if self.rows and self.rows[-1][1]:
            attrs, text = self.rows[-1][1][-1]
            self.rows[-1][1][-1] = (attrs, text + data)


def parse(html: str) -> Table:
    table = Table()
    table.feed(html)
    return table


def test_text_table_pads_every_column_but_the_last() -> None:
    text = text_table(["rank", "call"], [["0", "all_reduce"], ["10", "x"]], indent="  ")
    assert text.splitlines() == ["  rank  call", "  0     all_reduce", "  10    x"]


def test_html_table_escapes_text_and_styles_every_cell_inline() -> None:
    table = parse(html_table(["a<b"], [["<script>"], ["x"]]))
    head, first, _ = table.rows
    assert head[1][0][1] == "a<b" and first[1][0][1] == "<script>"
    assert all(cell[0]["style"] for _, cells in table.rows for cell in cells)
    assert "thead" in table.tags and "style" not in table.tags  # inline styles only


def test_html_table_rows_carry_highlight_mark_and_rich_cells() -> None:
    row = Row(
        ["0", Cell("<code>x</code>", style="color:red", title="why", colspan=2)], "#eee", "odd"
    )
    table = parse(html_table(None, [row]))
    ((attrs, cells),) = table.rows
    assert "thead" not in table.tags
    assert attrs == {"class": "distnb-odd", "style": "background:#eee"}
    rich = cells[1][0]
    assert rich["style"] == f"{CELL_STYLE};color:red" and rich["title"] == "why"
    assert rich["colspan"] == "2" and "code" in table.tags


def test_html_block_sets_the_first_line_bold() -> None:
    assert (
        html_block(["a&b", "c"], "x:y", bold=True) == '<div style="x:y"><b>a&amp;b</b><br>c</div>'
    )
    assert html_block("plain", "") == "<div>plain</div>"


def fingerprint(rank: int, shape: tuple[int, ...]) -> Fingerprint:
    return Fingerprint(
        rank=rank,
        group="WORLD",
        seq=7,
        op="all_reduce",
        inputs=(TensorSpec(shape, "float32", "cpu"),),
        outputs=(),
        reduce_op="sum",
        root=None,
        peer=None,
        in_splits=None,
        out_splits=None,
        count=1,
        finite=True,
        tag=None,
        group_ranks=(0, 1, 2),
        site=CallSite("train.py", 12, cell=3, code="dist.all_reduce(x)"),
    )


def mismatch(hint: str = "") -> Mismatch:
    fps = tuple(fingerprint(r, (5,) if r == 2 else (4,)) for r in range(3))
    return Mismatch(MatchKind.SHAPE, "all_reduce", "WORLD", 7, fps, "msg", ranks=(2,), hint=hint)


def test_mismatch_view_highlights_the_ranks_at_fault() -> None:
    view = MismatchView(mismatch(hint="check the batch size"))
    rows = parse(view._repr_html_()).rows
    assert [attrs.get("style") for attrs, _ in rows[1:]] == [
        None,
        None,
        f"background:{DIFF_ROW_BG}",
    ]
    lines = repr(view).splitlines()
    assert lines[0] == "shape mismatch in all_reduce #7 on WORLD"
    assert lines[1].split() == ["rank", "call", "call", "site"]
    assert lines[-1] == "check the batch size"


def test_status_lists_one_row_per_rank_or_says_why_not() -> None:
    ranks = (
        RankInfo(0, 0, 0, "h<1>", 123, "cpu", "gloo"),
        RankInfo(1, 1, 1, "h", 9, "cpu", "gloo"),
    )
    status = Status(ranks, note="2 ranks")
    assert repr(status).splitlines() == [
        "rank  host  pid  device  backend",
        "0     h<1>  123  cpu     gloo",
        "1     h     9    cpu     gloo",
        "hosts:",  # two host names: a row per host
        "host  address  ranks   local ranks  GPUs",
        "h<1>  -        rank 0  1            -",
        "h     -        rank 1  1            -",
        "2 ranks",
    ]
    cells = [[text for _, text in cells] for _, cells in parse(status._repr_html_()).rows]
    assert cells[1] == ["0", "h<1>", "123", "cpu", "gloo"]
    assert Status((), "stopped")._repr_html_() == "<p>stopped</p>"
