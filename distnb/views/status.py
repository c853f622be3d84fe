"""The session's status table, and start-up progress.

`Status` shows one row per rank (from `grouping.GROUP_FROM` ranks on, one per group of ranks
that agree: `0-7  node1  8 pids  cuda:0-7  nccl ...`): who it is (rank, host, pid, device,
backend) and, when the session asked the ranks, what it runs with (memory, CUDA memory,
torch's intra-op threads, whether it is alive); with ranks on several hosts, a row per host
(its address, its ranks, its GPUs); then the distributed environment grouped by value,
variables that differ between ranks first.
`Progress` is a tqdm bar: a widget in Jupyter, text on stderr in a terminal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from distnb.ranklist import format_ranks
from distnb.records.cell import RankInfo
from distnb.records.resources import RankResources, env_groups
from distnb.views._format import (
    DIFF_ROW_BG,
    HEADING_STYLE,
    Row,
    esc,
    format_bytes,
    html_block,
    html_table,
    text_table,
)
from distnb.views.display import in_kernel
from distnb.views.grouping import GROUP_FROM, group_rows

COLUMNS = ("rank", "host", "pid", "device", "backend")
# what sets ranks apart without saying anything about them: left out when grouping rows
APART = ("pid", "device", "memory (peak)", "cuda allocated", "reserved", "peak")
HOST_COLUMNS = ("host", "address", "ranks", "local ranks", "GPUs")
INTRA_OP_THREADS = "intra-op threads"
ALIVE = "alive"


@dataclass(frozen=True, slots=True)
class Status:
    """What `session.status()` returns: one row per rank, or a note that nothing runs.

    `resources` (one per rank, None where the rank did not answer) and `states` (`"alive"`, or
    how the rank died) are empty when the ranks were not asked.
    """

    ranks: tuple[RankInfo, ...]
    note: str = ""
    resources: tuple[RankResources | None, ...] = ()
    states: tuple[str, ...] = ()

    def columns(self) -> tuple[str, ...]:
        # `torch.get_num_threads()`, named so: a bare "threads" reads as the process's count.
        extra: tuple[str, ...] = ("memory (peak)", INTRA_OP_THREADS) if self.resources else ()
        if any(r is not None and r.cuda is not None for r in self.resources):
            extra += ("cuda allocated", "reserved", "peak")
        return COLUMNS + extra + (("state",) if self.states else ())

    def rows(self) -> list[tuple[str, ...]]:
        """A row per rank; from `GROUP_FROM` ranks on, a row per group of ranks that agree in
        everything but their number, pid, device index and memory (`views.grouping`)."""
        rows = self.rank_rows()
        if len(rows) < GROUP_FROM:
            return rows
        columns = self.columns()
        apart = [columns.index(c) for c in APART if c in columns]
        ranks = [r.rank for r in self.ranks]
        return group_rows(rows, ranks, apart, self._group_cell)

    def _group_cell(self, column: int, members: list[int]) -> str | None:
        """The pids' count and the memory's range of a group of ranks (None: `span` it)."""
        name = self.columns()[column]
        if name == "pid" and len(members) > 1:
            return f"{len(members)} pids"
        known = [m for m in members if self.resources and self.resources[m] is not None]
        if name != "memory (peak)" or len(known) < 2:
            return None
        rss = sorted(r.rss for m in known if (r := self.resources[m]) is not None)
        peak = max(r.peak_rss for m in known if (r := self.resources[m]) is not None)
        low, high = format_bytes(rss[0]), format_bytes(rss[-1])
        return f"{low if low == high else f'{low}-{high}'} ({format_bytes(peak)})"

    def rank_rows(self) -> list[tuple[str, ...]]:
        """A row per rank."""
        rows = []
        for i, r in enumerate(self.ranks):
            row: tuple[str, ...] = (str(r.rank), r.host, str(r.pid), r.device, r.backend)
            if self.resources:
                row += _resource_cells(self.resources[i], cuda="cuda allocated" in self.columns())
            rows.append(row + ((self.states[i],) if self.states else ()))
        return rows

    def hosts(self) -> list[tuple[str, ...]]:
        """(host, address, ranks, local ranks, GPUs) per host, when the ranks span several."""
        by_host: dict[str, list[RankInfo]] = {}
        for r in self.ranks:
            by_host.setdefault(r.host, []).append(r)
        if len(by_host) < 2:
            return []
        rows: list[tuple[str, ...]] = []
        for host, ranks in by_host.items():
            gpus = sorted({r.device for r in ranks if r.device.startswith("cuda")})
            addresses = sorted({r.address for r in ranks if r.address})
            rows.append(
                (
                    host,
                    ", ".join(addresses) or "-",
                    format_ranks(r.rank for r in ranks),
                    str(len(ranks)),
                    ", ".join(gpus) or "-",
                )
            )
        return rows

    def env(self) -> list[tuple[str, str, str, bool]]:
        """(variable, value, ranks, differs) rows; variables whose value differs come first."""
        known = [r for r in self.resources if r is not None]
        rows = [
            (name, value, format_ranks(ranks), len(values) > 1)
            for name, values in env_groups(known)
            for value, ranks in values
        ]
        return sorted(rows, key=lambda row: not row[3])

    def __repr__(self) -> str:
        if not self.ranks:
            return self.note or "distnb: no ranks"
        parts = [text_table(self.columns(), self.rows())]
        if hosts := self.hosts():
            parts.extend(["hosts:", text_table(HOST_COLUMNS, hosts)])
        if env := self.env():
            pairs = [(f"{name}={value}", ranks) for name, value, ranks, _ in env]
            width = max(len(pair) for pair, _ in pairs)
            parts.append("environment:")
            parts.extend(f"  {pair.ljust(width)}  {ranks}" for pair, ranks in pairs)
        return "\n".join([*parts, *([self.note] if self.note else [])])

    def _repr_html_(self) -> str:
        if not self.ranks:
            return f"<p>{esc(self.note or 'distnb: no ranks')}</p>"
        parts = [html_table(self.columns(), self.rows())]
        if hosts := self.hosts():
            parts.extend([html_block("hosts", HEADING_STYLE), html_table(HOST_COLUMNS, hosts)])
        if env := self.env():
            parts.append(html_block("environment", HEADING_STYLE))
            rows = [
                Row([name, value, ranks], DIFF_ROW_BG if differs else "")
                for name, value, ranks, differs in env
            ]
            parts.append(html_table(("variable", "value", "ranks"), rows))
        return "".join(parts) + (f"<p>{esc(self.note)}</p>" if self.note else "")


def _resource_cells(res: RankResources | None, cuda: bool) -> tuple[str, ...]:
    width = 5 if cuda else 2
    if res is None:
        return ("-",) * width
    cells: tuple[str, ...] = (
        f"{format_bytes(res.rss)} ({format_bytes(res.peak_rss)})",
        str(res.intra_op_threads),
    )
    if cuda:
        m = res.cuda
        cells += (
            (format_bytes(m.allocated), format_bytes(m.reserved), format_bytes(m.peak))
            if m is not None
            else ("-", "-", "-")
        )
    return cells


class Progress:
    """Start-up progress through tqdm: `show(phase, done)` moves the bar, `close()` ends it.

    In a Jupyter kernel `tqdm.auto` picks its widget (or text, in a frontend without widgets);
    elsewhere distnb asks for text, since `tqdm.auto` decides by the modules loaded and would
    draw a widget nobody sees once something has imported ipykernel.
    """

    def __init__(self, total: int, enabled: bool = True) -> None:
        self.total = total
        self._bar: Any = _bar(total) if enabled else None
        self._last: tuple[str, int] | None = None

    def show(self, phase: str, done: int) -> None:
        if self._bar is None or self._last == (phase, done):
            return
        self._last = (phase, done)
        self._bar.set_description_str(f"distnb: {phase}", refresh=False)
        self._bar.n = done
        self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _bar(total: int) -> Any:
    if in_kernel():
        from tqdm.auto import tqdm
    else:
        from tqdm.std import tqdm
    return tqdm(
        total=total,
        desc="distnb: starting engines",
        unit="rank",
        bar_format="{desc} {bar} {n_fmt}/{total_fmt} [{elapsed}]",
        dynamic_ncols=True,
    )


def status_of(ranks: Sequence[RankInfo], note: str = "") -> Status:
    return Status(tuple(ranks), note)


def show_where(label: str) -> None:
    """In Jupyter, a faint first line for a cell that auto mode sends to the ranks (terminal
    IPython says it in the prompt instead)."""
    from IPython.display import display

    html = (
        f'<div style="color:#888;font-size:11px;font-family:monospace">&#8680; {esc(label)}</div>'
    )
    display({"text/plain": f"[auto: {label}]", "text/html": html}, raw=True)  # type: ignore[no-untyped-call]
