"""Show a `ShapeTable`: plain text, static HTML, and an ipywidgets widget with filters.

From `grouping.GROUP_FROM` ranks on, ranks whose cells agree in every row share a column
(`ranks 0-31`), so 32 ranks that agree read as one column and a rank that differs stands alone.
Displaying a `ShapeTableView` gives static HTML (it survives nbconvert and GitHub, where widget
state does not); `view.widget()` adds a name filter and a differing-only switch. Module rows fold
their parameters and buffers into an HTML `<details>` under the row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from distnb.ranklist import format_ranks
from distnb.records.shapes import Entry, Field, ModuleMeta, ShapeScan, TensorMeta
from distnb.views._format import (
    DIFF_CELL_BG,
    DIFF_PART_STYLE,
    DIFF_ROW_BG,
    WARN_ROW_BG,
    Cell,
    Row,
    esc,
    html_block,
    html_table,
    text_table,
)
from distnb.views.grouping import GROUP_FROM
from distnb.views.shape_table import ShapeRow, ShapeTable, build_table

__all__ = ["ShapeTableView"]

LEGEND = "rg = requires_grad, .grad = .grad is set, NaN/Inf = holds a non-finite value"
Part = tuple[str, bool]  # text, whether it is a differing field


class ShapeTableView:
    """Per-rank shapes, differing names first.

    Example::

        view = ShapeTableView(build_table(scans))
        view            # static HTML table in a notebook, aligned text in a terminal
        view.widget()   # with a name filter and a differing-only switch
    """

    def __init__(self, table: ShapeTable, *, max_rows: int = 200, max_children: int = 100) -> None:
        self.table = table
        self.max_rows = max_rows
        self.max_children = max_children

    @classmethod
    def from_scans(cls, scans: Sequence[ShapeScan]) -> ShapeTableView:
        return cls(build_table(scans))

    def __repr__(self) -> str:
        return render_text(self.table, self.max_rows)

    def _repr_html_(self) -> str:
        return render_html(self.table, self.max_rows, self.max_children)

    def widget(self) -> Any:
        """An `ipywidgets.VBox`: filter controls above the HTML table."""
        import ipywidgets as w  # views are the only place ipywidgets is imported, lazily

        only = w.ToggleButtons(options=["all", "differing"], value="all", description="rows")
        pattern = w.Text(placeholder="filter names (substring)", description="name")
        out = w.HTML(self._repr_html_())

        def refresh(_: object = None) -> None:
            table = filter_table(self.table, pattern.value, only.value == "differing")
            out.value = render_html(table, self.max_rows, self.max_children)

        only.observe(refresh, names="value")
        pattern.observe(refresh, names="value")
        return w.VBox([w.HBox([only, pattern]), out])


def filter_table(table: ShapeTable, pattern: str = "", only_differing: bool = False) -> ShapeTable:
    rows = tuple(
        r
        for r in table.rows
        if (not only_differing or r.differs) and pattern.lower() in r.name.lower()
    )
    return ShapeTable(table.ranks, table.devices, rows, table.truncated)


def _summary(table: ShapeTable) -> str:
    ranks = format_ranks(table.ranks, none="no ranks")
    n_diff = len(table.differing)
    fields = sorted({f.value for r in table.differing for f in r.differs})
    head = f"Shapes on {ranks}: {len(table.rows)} names"
    if n_diff:
        head += f", {n_diff} differ across ranks ({', '.join(fields)})"
    else:
        head += ", all agree across ranks"
    skipped = sum(table.truncated)
    if skipped:
        head += f"; {skipped} values not scanned (container or scan limit)"
    return head


# -- cell contents -------------------------------------------------------------------------


def cell_parts(entry: Entry | None, marked: Sequence[Field]) -> list[Part]:
    """A cell as short parts, each flagged if it shows a field in which this cell deviates."""
    if entry is None:
        return [("missing", Field.MISSING in marked)]
    if isinstance(entry, TensorMeta):
        return _tensor_parts(entry, marked)
    return _module_parts(entry, marked)


def _tensor_parts(t: TensorMeta, marked: Sequence[Field]) -> list[Part]:
    parts: list[Part] = [
        ("[" + ", ".join(map(str, t.shape)) + "]", Field.SHAPE in marked),
        (t.dtype, Field.DTYPE in marked),
        (t.device, Field.DEVICE in marked),
    ]
    parts += _flag("rg", "no rg", t.requires_grad, Field.REQUIRES_GRAD in marked)
    parts += _flag(".grad", "no .grad", t.has_grad, Field.GRAD in marked)
    bad = bool(t.has_nonfinite) or bool(t.grad_nonfinite)
    label = "grad NaN/Inf" if t.grad_nonfinite and not t.has_nonfinite else "NaN/Inf"
    parts += _flag(label, "finite", bad, Field.NONFINITE in marked)
    return parts


def _module_parts(m: ModuleMeta, marked: Sequence[Field]) -> list[Part]:
    parts: list[Part] = [
        (m.type_name, Field.TYPE in marked),
        (f"{m.n_params} params ({m.param_numel:,})", Field.SHAPE in marked),
        ("/".join(m.dtypes) or "-", Field.DTYPE in marked),
        ("/".join(m.devices) or "-", Field.DEVICE in marked),
    ]
    if m.n_buffers:
        parts.insert(2, (f"{m.n_buffers} buffers", Field.SHAPE in marked))
    parts += _count("rg", m.n_requires_grad, m.n_params, Field.REQUIRES_GRAD in marked)
    parts += _count(".grad", m.n_grads, m.n_params, Field.GRAD in marked)
    if m.n_nonfinite or m.n_grads_nonfinite or Field.NONFINITE in marked:
        text = f"NaN/Inf in {m.n_nonfinite or 0} tensors, {m.n_grads_nonfinite or 0} grads"
        parts.append((text, Field.NONFINITE in marked))
    return parts


def _flag(yes: str, no: str, value: bool, marked: bool) -> list[Part]:
    if value:
        return [(yes, marked)]
    return [(no, True)] if marked else []


def _count(label: str, k: int, n: int, marked: bool) -> list[Part]:
    if k == 0 and not marked:
        return []
    return [(label if k == n and n else f"{label} {k}/{n}", marked)]


# -- text ----------------------------------------------------------------------------------


def column_groups(table: ShapeTable) -> list[list[int]]:
    """Columns (indexes into `table.ranks`) that show the same thing in every row, children
    included, each tensor's device read against its rank's own: from `GROUP_FROM` ranks on such
    ranks share one column (`ranks 0-31`); below, each rank has its own."""
    n = len(table.ranks)
    if n < GROUP_FROM:
        return [[i] for i in range(n)]
    signatures: dict[tuple[object, ...], list[int]] = {}
    for i, device in enumerate(table.devices):
        sig = tuple((*_own(r.cells[i], device), r.marked[i]) for r in _all_rows(table.rows))
        signatures.setdefault(sig, []).append(i)
    return list(signatures.values())


def _all_rows(rows: Sequence[ShapeRow]) -> list[ShapeRow]:
    return [x for r in rows for x in (r, *r.children)]


def _own(entry: Entry | None, device: str) -> tuple[object, ...]:
    """An entry with its rank's own device left out, as a comparable tuple."""
    if isinstance(entry, TensorMeta) and entry.device == device:
        return (replace(entry, device=""),)
    return (entry,)


def _headers(table: ShapeTable, groups: list[list[int]], devices: bool) -> list[str]:
    out = []
    for g in groups:
        ranks = format_ranks(table.ranks[i] for i in g)
        kinds = sorted({table.devices[i].split(":")[0] for i in g})
        out.append(f"{ranks} ({'/'.join(kinds)})" if devices else ranks)
    return out


def _pick(row: ShapeRow, groups: list[list[int]]) -> ShapeRow:
    """The row with one cell per column group (its first rank's)."""
    return replace(
        row,
        cells=tuple(row.cells[g[0]] for g in groups),
        marked=tuple(row.marked[g[0]] for g in groups),
        children=tuple(_pick(c, groups) for c in row.children),
    )


def render_text(table: ShapeTable, max_rows: int = 200, max_children: int = 10) -> str:
    """Aligned text; a deviating cell starts with `*`; differing module parameters indented."""
    groups = column_groups(table)
    header = ["name", *_headers(table, groups, devices=False), "differs"]
    table = replace(table, rows=tuple(_pick(r, groups) for r in table.rows))
    rows: list[list[str]] = []
    for row in table.rows[:max_rows]:
        rows.append(_text_row(row.name, row))
        differing = [c for c in row.children if c.differs]
        for child in differing[:max_children]:
            rows.append(_text_row("  ." + child.name, child))
        if len(differing) > max_children:
            rows.append(
                [f"  ... {len(differing) - max_children} more differing", *[""] * (len(header) - 1)]
            )
    lines = [_summary(table), ""]
    lines.append(text_table(header, rows) if rows else "(no tensors or modules found)")
    if len(table.rows) > max_rows:
        lines.append(f"... {len(table.rows) - max_rows} more rows")
    lines.append(f"(* = this rank differs; {LEGEND})")
    return "\n".join(lines)


def _text_row(name: str, row: ShapeRow) -> list[str]:
    cells = []
    for entry, marked in zip(row.cells, row.marked, strict=True):
        text = " ".join(t for t, _ in cell_parts(entry, marked))
        cells.append(("*" if marked else " ") + text)
    return [name, *cells, ",".join(f.value for f in row.differs)]


# -- HTML ----------------------------------------------------------------------------------


SUMMARY_STYLE = "font-family:sans-serif;font-size:13px;margin:4px 0"
LEGEND_STYLE = "font-family:sans-serif;font-size:11px;color:#666"
CHILDREN_STYLE = "padding:0 0 0 16px;border-bottom:none;white-space:normal"


def render_html(table: ShapeTable, max_rows: int = 200, max_children: int = 100) -> str:
    """Static HTML with inline styles; modules expand through `<details>`."""
    groups = column_groups(table)
    ncols = len(groups) + 2
    if len(groups) == len(table.ranks):
        heads = [f"rank {r} ({d})" for r, d in zip(table.ranks, table.devices, strict=True)]
    else:
        heads = _headers(table, groups, devices=True)
    header = ["name", *heads, "differs"]
    table = replace(table, rows=tuple(_pick(r, groups) for r in table.rows))
    rows: list[Row] = []
    for row in table.rows[:max_rows]:
        rows.append(_html_row(row.name, row))
        if row.children:
            rows.append(_html_children(row, ncols, max_children))
    if len(table.rows) > max_rows:
        rows.append(_more_row(len(table.rows) - max_rows, "rows", ncols))
    return (
        f"<div>{html_block(_summary(table), SUMMARY_STYLE, bold=True)}"
        f"{html_table(header, rows)}{html_block(LEGEND, LEGEND_STYLE)}</div>"
    )


def _html_row(name: str, row: ShapeRow) -> Row:
    bg = DIFF_ROW_BG if row.differs else WARN_ROW_BG if row.nonfinite else ""
    cells: list[str | Cell] = [name]
    cells += [_html_cell(e, marked) for e, marked in zip(row.cells, row.marked, strict=True)]
    cells.append(", ".join(f.value for f in row.differs))
    return Row(cells, background=bg)


def _html_cell(entry: Entry | None, marked: Sequence[Field]) -> Cell:
    parts = " ".join(
        f'<span style="{DIFF_PART_STYLE}">{esc(t)}</span>' if m else esc(t)
        for t, m in cell_parts(entry, marked)
    )
    if not marked:
        return Cell(parts)
    title = "differs: " + ", ".join(f.value for f in marked)
    return Cell(parts, style=f"background:{DIFF_CELL_BG}", title=title)


def _html_children(row: ShapeRow, ncols: int, max_children: int) -> Row:
    n_diff = sum(1 for c in row.children if c.differs)
    label = f"{len(row.children)} parameters and buffers of {row.name}"
    if n_diff:
        label += f" ({n_diff} differ)"
    inner = [_html_row(c.name, c) for c in row.children[:max_children]]
    if len(row.children) > max_children:
        inner.append(_more_row(len(row.children) - max_children, "", ncols))
    details = (
        f'<details{" open" if n_diff else ""}><summary style="cursor:pointer;font-size:12px">'
        f"{esc(label)}</summary>{html_table(None, inner)}</details>"
    )
    return Row([Cell(details, style=CHILDREN_STYLE, colspan=ncols)])


def _more_row(n: int, what: str, ncols: int) -> Row:
    return Row([Cell(esc(f"... {n} more {what}".rstrip()), colspan=ncols)])
