"""Formatting shared by the views: units, and every table, as aligned text or as HTML.

HTML carries inline styles only: nbconvert output and GitHub drop `<style>` blocks and the CSS
of classes. A table is a header and rows; a row is its cells plus, optionally, a background
(the views' highlighting) and a mark (`class="distnb-<mark>"`, which tests and users can find).
A cell is plain text (escaped here) or a `Cell` holding HTML, for code, tooltips and spans.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "Cell",
    "Row",
    "esc",
    "format_bytes",
    "format_ns",
    "html_block",
    "html_table",
    "text_table",
]

TABLE_STYLE = "border-collapse:collapse;font-family:monospace;font-size:12px;text-align:left"
CELL_STYLE = "padding:2px 8px;border-bottom:1px solid #ddd;vertical-align:top;white-space:nowrap"
HEAD_STYLE = CELL_STYLE + ";border-bottom:2px solid #888;background:#f4f4f4"
DIFF_ROW_BG = "#fff1f0"
DIFF_CELL_BG = "#ffd6d1"
DIFF_PART_STYLE = "color:#b3261e;font-weight:bold"
WARN_ROW_BG = "#fff8e1"
HEADING_STYLE = "font-family:sans-serif;font-size:13px;margin:8px 0 2px"  # above a table


@dataclass(frozen=True, slots=True)
class Cell:
    """A cell whose content is HTML already; `style` is added to the cell's own style."""

    html: str
    style: str = ""
    title: str = ""
    colspan: int = 1


@dataclass(frozen=True, slots=True)
class Row:
    """A highlighted row: `background` colours it, `mark` sets `class="distnb-<mark>"`."""

    cells: Sequence[str | Cell]
    background: str = ""
    mark: str = ""


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_ns(ns: float) -> str:
    """A duration in the unit that keeps 3-4 significant digits: '850 ns', '12.3 ms', '2.41 s'."""
    a = abs(ns)
    if a < 1_000:
        return f"{ns:.0f} ns"
    if a < 1_000_000:
        return f"{ns / 1e3:.1f} µs"
    if a < 1_000_000_000:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e9:.2f} s"


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "") -> str:
    """Columns padded to their widest cell; the last column is not padded."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for r in [header, *rows]:
        cells = [c.ljust(w) for c, w in zip(r[:-1], widths, strict=False)] + [r[-1]]
        lines.append((indent + "  ".join(cells)).rstrip())
    return "\n".join(lines)


def html_table(header: Sequence[str] | None, rows: Iterable[Row | Sequence[str | Cell]]) -> str:
    """A `<table>` with inline styles; `header` None leaves out the `<thead>`.

    Example::

        html_table(["rank", "call"], [["0", "all_reduce"], Row(["1", "broadcast"], DIFF_ROW_BG)])
    """
    head = ""
    if header is not None:
        cells = "".join(f'<th style="{HEAD_STYLE}">{esc(h)}</th>' for h in header)
        head = f"<thead><tr>{cells}</tr></thead>"
    body = "".join(_html_row(r if isinstance(r, Row) else Row(r)) for r in rows)
    return f'<table style="{TABLE_STYLE}">{head}<tbody>{body}</tbody></table>'


def html_block(lines: str | Sequence[str], style: str, *, bold: bool = False) -> str:
    """Escaped text in a styled `<div>`, one line per item; `bold` sets the first line in bold."""
    first, *rest = [lines] if isinstance(lines, str) else lines
    head = f"<b>{esc(first)}</b>" if bold else esc(first)
    attr = f' style="{style}"' if style else ""
    return f"<div{attr}>{head}{''.join(f'<br>{esc(line)}' for line in rest)}</div>"


def _html_row(row: Row) -> str:
    mark = f' class="distnb-{row.mark}"' if row.mark else ""
    style = f' style="background:{row.background}"' if row.background else ""
    return f"<tr{mark}{style}>{''.join(map(_html_cell, row.cells))}</tr>"


def _html_cell(cell: str | Cell) -> str:
    if isinstance(cell, str):
        return f'<td style="{CELL_STYLE}">{esc(cell)}</td>'
    style = f"{CELL_STYLE};{cell.style}" if cell.style else CELL_STYLE
    title = f' title="{esc(cell.title)}"' if cell.title else ""
    span = f' colspan="{cell.colspan}"' if cell.colspan > 1 else ""
    return f'<td{span} style="{style}"{title}>{cell.html}</td>'
