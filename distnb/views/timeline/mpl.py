"""Draw a `Timeline` with matplotlib: for `savefig` (PNG) and for users who want a Figure.

Builds a bare `matplotlib.figure.Figure` (no pyplot): it renders with the Agg canvas, touches no
global backend state and is not left open in pyplot's figure list. Bars are one `PolyCollection`
per op built from a vertex array, so 10,000 events are a handful of artists. Waits are grey bars,
slimmer than the collectives; they are hatched only when there are at most `HATCH_LIMIT`, because
Agg hatching costs ~0.4 ms a bar (3 s for 7,500 waits, measured).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from typing import Any

from distnb.views.timeline.layout import WAIT_COLOR, lane_index, lane_slots, lanes, op_colors
from distnb.views.timeline.model import Timeline

__all__ = ["figure"]

HATCH_LIMIT = 1_000
WAIT_FILL = "#dddddd"


def figure(
    tl: Timeline,
    *,
    ranks: Collection[int] | None = None,
    ops: Collection[str] | None = None,
    width: float = 12.0,
) -> Any:
    """A `matplotlib.figure.Figure`: one lane per rank (and group; from `GROUP_FROM` ranks on,
    per group of ranks that agree), waits in grey."""
    from matplotlib.collections import PolyCollection
    from matplotlib.figure import Figure  # only views import matplotlib, and only when drawing
    from matplotlib.patches import Patch

    rows = lanes(tl, ranks)
    colors = op_colors(s.op for s in tl.ops)
    bars, waits = _spans(tl, lane_index(rows), ops)
    ms = 1e-6
    fig = Figure(figsize=(width, 1.2 + 0.35 * max(len(rows), 1)), layout="constrained")
    ax = fig.add_subplot()
    hatch = "////" if len(waits) <= HATCH_LIMIT else None
    span_ms = max((tl.t1_ns - tl.t0_ns) * ms, 1e-3)
    # A collective shorter than a pixel would vanish: bars get about a pixel at 100 dpi (edges
    # would do the same but cost 25% more to draw). Axis-aligned bars need no antialiasing.
    min_w = span_ms / (width * 100)
    ax.add_collection(
        PolyCollection(
            _boxes(waits, 0.25),
            facecolor=WAIT_FILL,
            edgecolor=WAIT_COLOR,
            hatch=hatch,
            linewidth=0,
            antialiased=False,
        ),
        autolim=False,  # the limits are set below; computing them costs 0.15 s at 10,000 bars
    )
    for op, spans in bars.items():
        ax.add_collection(
            PolyCollection(
                _boxes(spans, 0.4, min_w), facecolor=colors[op], linewidth=0, antialiased=False
            ),
            autolim=False,
        )
    ax.set_yticks(range(len(rows)), [lane.label for lane in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, span_ms)
    ax.set_xlabel("ms since first arrival")
    ax.set_title(f"{len(tl.collectives)} collectives · {tl.clock_note}", fontsize=9)
    handles = [Patch(facecolor=c, label=op) for op, c in colors.items()]
    handles.append(Patch(facecolor=WAIT_FILL, edgecolor=WAIT_COLOR, hatch=hatch, label="wait"))
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 6), fontsize=8)
    return fig


Span = tuple[float, float, float]  # lane, start and end in ms since the first arrival


def _spans(
    tl: Timeline, ys: dict[tuple[int, str], int], ops: Collection[str] | None
) -> tuple[dict[str, list[Span]], list[Span]]:
    """The collectives' bars by op, and the waits before them, on the lanes in `ys`."""
    bars: dict[str, list[Span]] = defaultdict(list)
    waits: list[Span] = []
    ms = 1e-6
    for c in tl.collectives:
        if ops is not None and c.op not in ops:
            continue
        for y, s in lane_slots(c, ys).items():
            wait_end = min(c.last_arrive_ns, s.start_ns)
            if wait_end > s.arrive_ns:
                waits.append((y, (s.arrive_ns - tl.t0_ns) * ms, (wait_end - tl.t0_ns) * ms))
            end = s.end_ns if s.end_ns is not None else s.start_ns
            bars[c.op].append((y, (s.start_ns - tl.t0_ns) * ms, (end - tl.t0_ns) * ms))
    return bars, waits


def _boxes(spans: list[Span], half: float, min_w: float = 0.0) -> Any:
    """(lane, x0, x1) spans as an (n, 4, 2) array of rectangle corners, `min_w` wide at least."""
    import numpy as np

    a = np.asarray(spans, dtype=float).reshape(-1, 3)
    y, x0 = a[:, 0], a[:, 1]
    x1 = np.maximum(a[:, 2], x0 + min_w)
    xs = np.stack([x0, x1, x1, x0], axis=1)
    yy = np.stack([y - half, y - half, y + half, y + half], axis=1)
    return np.stack([xs, yy], axis=2)
