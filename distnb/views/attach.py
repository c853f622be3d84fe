"""An attached job at a glance: a status table per rank, the verdicts, and the live stacks of
every rank, grouped where identical ("ranks 0,2-15: ..."), so 16 ranks read like 2.

`JobView` renders as aligned text (`repr`, for terminals and logs) and as HTML with inline
styles (`_repr_html_`, for notebooks, nbconvert and GitHub).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from distnb.ranklist import format_ranks
from distnb.records.attach import RankSnapshot, StackFrame
from distnb.views._format import HEADING_STYLE, WARN_ROW_BG, Row, esc, html_block, html_table
from distnb.views._format import text_table as _text_table

__all__ = ["HEADER", "JobView", "group_stacks", "row"]

HEADER = ["rank", "host", "pid", "state", "step", "collective", "where"]
_VERDICT_STYLE = "font-family:monospace;white-space:pre-wrap;color:#b3261e;margin:6px 0"
_STACK_STYLE = "font-family:monospace;white-space:pre;font-size:12px;margin:2px 0 8px"


def group_stacks(
    snapshots: Sequence[RankSnapshot],
) -> list[tuple[list[int], tuple[StackFrame, ...]]]:
    """(ranks, stack) for each distinct stack (by file, line and function), largest group
    first."""
    groups: dict[tuple[tuple[str, int, str], ...], list[RankSnapshot]] = {}
    for s in snapshots:
        if s.stack:
            key = tuple((f.file, f.line, f.function) for f in s.stack)
            groups.setdefault(key, []).append(s)
    ordered = sorted(groups.values(), key=lambda g: (-len(g), g[0].rank))
    return [([s.rank for s in g], g[0].stack) for g in ordered]


def row(s: RankSnapshot) -> list[str]:
    fp = s.current.fingerprint if s.current is not None else None
    if s.current is not None and s.current.seq < 0:  # read from a stack: no seq, group or age
        call = f"in {s.current.op}" + (f" ({fp.origin})" if fp is not None and fp.origin else "")
    elif s.current is not None:
        call = f"in {s.current.op} #{s.current.seq} on {s.current.group} ({s.current.age_s:.1f} s)"
    elif s.last is not None:
        call = f"after {s.last.op} #{s.last.seq} on {s.last.group}"
    else:
        call = ""
    user = _user_frame(s.stack)
    where = s.where or (f"{user.file}:{user.line}" if user is not None else "")
    step = "" if s.step is None else str(s.step)
    return [str(s.rank), s.host, str(s.pid), s.state.value, step, call, where]


@dataclass(frozen=True)
class JobView:
    """What `status()` of an attached job returns (see the module)."""

    title: str
    snapshots: tuple[RankSnapshot, ...]
    verdicts: tuple[str, ...] = ()
    note: str = ""

    def __repr__(self) -> str:
        parts = [self.title, _text_table(HEADER, [row(s) for s in self.snapshots])]
        parts += [f"verdict: {v}" for v in self.verdicts]
        for ranks, stack in group_stacks(self.snapshots):
            parts.append(f"{format_ranks(ranks)}:\n" + "\n".join(_frame_lines(stack)))
        if self.note:
            parts.append(self.note)
        return "\n".join(parts)

    def _repr_html_(self) -> str:
        rows = [
            Row(row(s), WARN_ROW_BG if s.current else "", mark=f"rank-{s.rank}")
            for s in self.snapshots
        ]
        parts = [html_block(self.title, HEADING_STYLE, bold=True), html_table(HEADER, rows)]
        parts += [html_block(v.split("\n"), _VERDICT_STYLE) for v in self.verdicts]
        for ranks, stack in group_stacks(self.snapshots):
            parts.append(html_block(format_ranks(ranks), HEADING_STYLE, bold=True))
            parts.append(
                f'<div style="{_STACK_STYLE}">{esc(chr(10).join(_frame_lines(stack)))}</div>'
            )
        if self.note:
            parts.append(html_block(self.note.split("\n"), HEADING_STYLE))
        return "".join(parts)


def _user_frame(stack: Sequence[StackFrame]) -> StackFrame | None:
    """The innermost frame outside torch (where the job's code called in), else the innermost."""
    for f in reversed(stack):
        if "/torch/" not in f.file.replace("\\", "/") and not f.file.startswith("<frozen"):
            return f
    return stack[-1] if stack else None


_DEPTH = 12  # innermost frames shown per stack


def _frame_lines(stack: Sequence[StackFrame]) -> list[str]:
    """The innermost `_DEPTH` frames, without the import machinery's."""
    shown = [f for f in stack if not f.file.startswith("<frozen")]
    lines = [f"  ... {len(shown) - _DEPTH} outer frames"] if len(shown) > _DEPTH else []
    for f in shown[-_DEPTH:]:
        lines.append(f'  File "{f.file}", line {f.line}, in {f.function}')
        if f.code:
            lines.append(f"    {f.code}")
    return lines
