"""Comparing shape scans across ranks and rendering the table (pure, milliseconds)."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from distnb.errors import ConfigError
from distnb.records.shapes import Field, ModuleMeta, ShapeScan, TensorMeta
from distnb.views.shape_table import build_table
from distnb.views.shapes import ShapeTableView, filter_table, render_text


def t(name: str, shape: tuple[int, ...] = (4, 8), **kw: object) -> TensorMeta:
    base: dict[str, object] = {"dtype": "float32", "device": "cpu"}
    return TensorMeta(name, shape, **{**base, **kw})  # type: ignore[arg-type]


def linear(name: str, out: int, *, nan: bool = False, grads: bool = True) -> ModuleMeta:
    params = (
        t("weight", (out, 4), requires_grad=True, has_nonfinite=nan, has_grad=grads),
        t("bias", (out,), requires_grad=True, has_nonfinite=False, has_grad=grads),
    )
    return ModuleMeta(
        name=name,
        type_name="Linear",
        training=True,
        n_params=2,
        param_numel=out * 4 + out,
        n_buffers=0,
        buffer_numel=0,
        dtypes=("float32",),
        devices=("cpu",),
        n_requires_grad=2,
        n_grads=2 if grads else 0,
        n_nonfinite=int(nan),
        n_grads_nonfinite=0,
        params=params,
    )


def scan(rank: int, *entries: TensorMeta | ModuleMeta, **kw: object) -> ShapeScan:
    return ShapeScan(rank, entries, **kw)  # type: ignore[arg-type]


def test_rank_dependent_shape_comes_first_with_the_shape_marked() -> None:
    table = build_table(
        [scan(0, t("a"), t("x", (4, 8)), t("z")), scan(1, t("a"), t("x", (4, 9)), t("z"))]
    )
    assert [r.name for r in table.rows] == ["x", "a", "z"]
    row = table.rows[0]
    assert row.differs == (Field.SHAPE,)
    assert row.marked == ((Field.SHAPE,), (Field.SHAPE,))  # two ranks: no majority, both marked
    assert not table.rows[1].differs


def test_scans_are_put_in_rank_order() -> None:
    table = build_table([scan(1, t("x", (2,))), scan(0, t("x", (1,)))])
    assert table.ranks == (0, 1)
    cell0 = table.rows[0].cells[0]
    assert isinstance(cell0, TensorMeta) and cell0.shape == (1,)


def test_majority_leaves_only_the_odd_rank_marked() -> None:
    scans = [scan(r, t("x", dtype="bfloat16" if r == 2 else "float32")) for r in range(4)]
    row = build_table(scans).rows[0]
    assert row.differs == (Field.DTYPE,)
    assert row.marked == ((), (), (Field.DTYPE,), ())


def test_missing_names_are_cells_marked_missing() -> None:
    table = build_table([scan(0, t("a"), t("only0")), scan(1, t("a"), not_found=("asked",))])
    rows = {r.name: r for r in table.rows}
    assert rows["only0"].cells[1] is None
    assert rows["only0"].differs == (Field.MISSING,)
    assert rows["only0"].marked == ((), (Field.MISSING,))
    assert rows["asked"].cells == (None, None)
    assert "missing" in render_text(table)


def test_each_differing_field_is_named() -> None:
    a = t("x", requires_grad=True, has_grad=True, has_nonfinite=False, device="cpu")
    b = t("x", requires_grad=False, has_nonfinite=True, device="meta")
    assert build_table([scan(0, a), scan(1, b)]).rows[0].differs == (
        Field.DEVICE,
        Field.REQUIRES_GRAD,
        Field.GRAD,
        Field.NONFINITE,
    )


def test_devices_compare_relative_to_each_ranks_own_device() -> None:
    own = [scan(r, t("x", device=f"cuda:{r}"), device=f"cuda:{r}") for r in range(2)]
    assert not build_table(own).rows[0].differs
    # Rank 1 built its tensor on rank 0's GPU: that one stands out.
    stray = [scan(r, t("x", device="cuda:0"), device=f"cuda:{r}") for r in range(3)]
    row = build_table(stray).rows[0]
    assert row.differs == (Field.DEVICE,)
    assert row.marked == ((), (Field.DEVICE,), (Field.DEVICE,))


def test_nonfinite_rows_follow_differing_rows_even_when_ranks_agree() -> None:
    table = build_table(
        [scan(r, t("ok"), t("nan", has_nonfinite=True), t("diff", (r + 1,))) for r in range(2)]
    )
    assert [r.name for r in table.rows] == ["diff", "nan", "ok"]
    assert table.rows[1].nonfinite and not table.rows[1].differs


def test_module_row_summarises_and_its_parameters_show_which_differs() -> None:
    table = build_table([scan(0, linear("model", 8)), scan(1, linear("model", 9))])
    row = table.rows[0]
    assert row.is_module
    assert row.differs == (Field.SHAPE,)
    assert [c.name for c in row.children] == ["weight", "bias"]
    assert all(c.differs == (Field.SHAPE,) for c in row.children)


def test_module_with_equal_totals_still_differs_through_its_parameters() -> None:
    # Same counts and numel, parameters swapped in shape: only the children can tell.
    a, b = linear("m", 8), linear("m", 8)
    b = ModuleMeta(
        **{
            **{f: getattr(b, f) for f in ModuleMeta.__slots__},
            "params": (
                t("weight", (4, 8), requires_grad=True, has_nonfinite=False, has_grad=True),
                b.params[1],
            ),
        }
    )
    row = build_table([scan(0, a), scan(1, b)]).rows[0]
    assert row.differs == (Field.SHAPE,)
    assert [c.name for c in row.children if c.differs] == ["weight"]


def test_module_missing_on_a_rank_does_not_list_each_parameter_missing() -> None:
    row = build_table([scan(0, linear("m", 8)), scan(1)]).rows[0]
    assert row.differs == (Field.MISSING,)
    assert all(not c.differs for c in row.children)


def test_module_grads_and_nonfinite_are_compared() -> None:
    row = build_table(
        [scan(0, linear("m", 8, nan=True)), scan(1, linear("m", 8, grads=False))]
    ).rows[0]
    assert Field.GRAD in row.differs and Field.NONFINITE in row.differs
    assert row.nonfinite


def test_two_scans_of_one_rank_are_refused() -> None:
    with pytest.raises(ConfigError, match="two scans for rank 0"):
        build_table([scan(0), scan(0)])


def test_text_marks_differing_cells_with_a_star() -> None:
    text = repr(
        ShapeTableView(build_table([scan(0, t("x", (4,)), t("a")), scan(1, t("x", (5,)), t("a"))]))
    )
    lines = text.splitlines()
    x_line = next(line for line in lines if line.startswith("x "))
    a_line = next(line for line in lines if line.startswith("a "))
    assert x_line.count("*[") == 2 and x_line.rstrip().endswith("shape")
    assert "*" not in a_line
    assert "1 differ across ranks (shape)" in lines[0]


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)


def test_html_is_static_with_details_for_modules_and_marked_cells() -> None:
    table = build_table(
        [scan(0, linear("model", 8), t("x", (1,))), scan(1, linear("model", 9), t("x", (1,)))]
    )
    html = ShapeTableView(table)._repr_html_()
    parser = _Collect()
    parser.feed(html)
    assert "details" in parser.tags and "summary" in parser.tags
    assert "<script" not in html and "<style" not in html
    assert 'title="differs: shape"' in html
    assert "2 parameters and buffers of model (2 differ)" in html


def test_html_escapes_names() -> None:
    html = ShapeTableView(build_table([scan(0, t('batch["<b>"]'))]))._repr_html_()
    assert "&lt;b&gt;" in html and '<b>"]' not in html


def test_filter_keeps_differing_or_matching_names() -> None:
    table = build_table([scan(0, t("xa", (1,)), t("xb")), scan(1, t("xa", (2,)), t("xb"))])
    assert [r.name for r in filter_table(table, only_differing=True).rows] == ["xa"]
    assert [r.name for r in filter_table(table, "B").rows] == ["xb"]


def test_widget_filters_rows() -> None:
    pytest.importorskip("ipywidgets")
    table = build_table([scan(0, t("xa", (1,)), t("xb")), scan(1, t("xa", (2,)), t("xb"))])
    box = ShapeTableView(table).widget()
    controls, out = box.children
    only, pattern = controls.children
    assert "xb" in out.value
    only.value = "differing"
    assert "xb" not in out.value and "xa" in out.value
    only.value = "all"
    pattern.value = "xb"
    assert "xa" not in out.value


def test_thirty_two_ranks_that_agree_share_a_column_and_the_odd_one_stands_alone() -> None:
    scans = [
        scan(
            r,
            t("x", (4, 9 if r == 17 else 8), device=f"cuda:{r % 8}"),
            linear("fc", 3),
            device=f"cuda:{r % 8}",
        )
        for r in range(32)
    ]
    view = ShapeTableView.from_scans(scans)
    header = render_text(view.table).splitlines()[2]
    assert header.split() == ["name", "ranks", "0-16,18-31", "rank", "17", "differs"]
    assert "*[4, 9] float32 cuda:1" in render_text(view.table)  # rank 17's own cell, marked
    html = view._repr_html_()
    assert "ranks 0-16,18-31 (cuda)" in html and "rank 17 (cuda)" in html
    assert html.count("</th>") == 4  # name, two rank columns, differs
