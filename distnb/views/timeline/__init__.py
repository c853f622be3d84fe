"""Show collective timelines: text summary, static HTML (SVG), widget, PNG and Chrome trace.

`TimelineView` takes plain `CollectiveEvent` records, so a saved report renders again without a
session. Displaying it gives static HTML: an inline SVG whose bars show their call site on hover,
the straggler summary and the per-op table. `view.widget()` adds rank/op/group selectors and a
list of collectives; picking one outlines it in the drawing and lists each rank's call site. (A
matplotlib pick handler would need an interactive backend; the widget works with any.)

The package: `model` (the numbers, pure); `layout` (lanes and colours both drawings share); one
renderer per output: `summary` (text and HTML tables), `svg`, `mpl` (matplotlib), `chrome`
(Chrome trace JSON), `widget` (ipywidgets, reusing `summary` and `svg`); `bandwidth` (nccl-tests'
bus-bandwidth arithmetic); `view` (`TimelineView`, the facade). The facade imports the renderers;
none of them imports it, or this package. matplotlib and ipywidgets load only when a figure or
widget is made.
"""

from __future__ import annotations

from distnb.views.timeline.model import ClockOffsets
from distnb.views.timeline.view import TimelineView

__all__ = ["ClockOffsets", "TimelineView"]
