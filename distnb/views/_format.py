"""Small formatting helpers shared by the views: units, aligned text tables, HTML bits."""

from __future__ import annotations

import html
from collections.abc import Sequence

__all__ = ["esc", "format_bytes", "format_ns", "text_table"]

# Inline styles only: nbconvert output and GitHub drop <style> blocks and classes' CSS.
TABLE_STYLE = "border-collapse:collapse;font-family:monospace;font-size:12px;text-align:left"
CELL_STYLE = "padding:2px 8px;border-bottom:1px solid #ddd;vertical-align:top;white-space:nowrap"
HEAD_STYLE = CELL_STYLE + ";border-bottom:2px solid #888;background:#f4f4f4"
DIFF_ROW_BG = "#fff1f0"
DIFF_CELL_BG = "#ffd6d1"
DIFF_PART_STYLE = "color:#b3261e;font-weight:bold"
WARN_ROW_BG = "#fff8e1"


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
