"""Notebooks in a real JupyterLab, seen through a real browser.

JupyterLab serves a temporary folder holding copies of notebooks/ (127.0.0.1, a free port, a
token, its own settings and workspace); Debian's Chromium, driven by Playwright, opens a notebook,
runs *Run > Run All Cells* and waits until the last cell has run. Then it checks what a user sees:

- 01-quickstart.ipynb: each rank's lines, the errors, and the `%dist_shapes` widget rendered as a
  widget (not "Error displaying widget", not a model's repr) that answers when typed into;
- 04-shapes-and-timelines.ipynb: the `%dist_timeline` and `%%allranks --timeline` widgets with
  their SVG drawing and straggler table, a collective picked from the list showing each rank's
  arrival, and the exported trace, read back by the notebook (which then removes it);
- 08-step-into-a-rank.ipynb: a rank's debugger prompt in JupyterLab's input box, labelled with
  the rank, answered by typing into it as a user does.

Screenshots go to artifacts/browser/, as does the server's log. The server, the browser and
the helpers that drive a notebook are in harness/lab.py.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from harness.lab import (
    ARTIFACTS,
    BROKEN_WIDGET,
    DEBUGGER,
    NOTEBOOK,
    TIMELINES,
    WAIT_MS,
    Lab,
    answer_prompt,
    assert_in_order,
    cell,
    cell_indices,
    open_prompt,
    output_text,
    run_all_cells,
    wait_until_last_cell_ran,
)

pytestmark = [pytest.mark.cluster, pytest.mark.browser]


@pytest.mark.usefixtures("chromium")  # first: skip before starting JupyterLab
def test_quickstart_renders_rank_output_errors_and_widgets(lab: Lab, page: Any) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)  # the default 5 s is short for a loaded 2-core machine
    index = cell_indices(NOTEBOOK)
    try:
        run_all_cells(page, lab, NOTEBOOK)

        ranks = cell(page, index["all-reduce"])
        assert_in_order(
            output_text(ranks),
            "[rank 0] before: [0.0, 1.0, 2.0]",
            "[rank 1] before: [1.0, 2.0, 3.0]",
            "[ranks 0-1] after:  [1.0, 3.0, 5.0]",  # the same line on both ranks, once
        )
        ranks.screenshot(path=ARTIFACTS / "quickstart-all-reduce.png")
        error = cell(page, index["rank-error"])
        assert_in_order(output_text(error), "RankError", "[rank 1] ValueError: bad batch")
        error.screenshot(path=ARTIFACTS / "quickstart-rank-error.png")
        hang = cell(page, index["hang"])
        assert_in_order(output_text(hang), "RankTimeoutError", "[rank 0]", "[rank 1]")
        hang.screenshot(path=ARTIFACTS / "quickstart-hang-report.png")
        assert "[ranks 0-1] [2.0, 6.0, 10.0]" in output_text(cell(page, index["after-hang"]))

        shapes = cell(page, index["shapes"])
        widget = shapes.locator(".jp-OutputArea-output .widget-vbox").first
        expect(widget).to_be_visible()
        expect(widget.locator(".widget-toggle-buttons")).to_be_visible()
        table = widget.locator(".widget-html")
        expect(table).to_contain_text("Shapes on ranks 0-1")
        expect(table).to_contain_text("[5, 16]")
        shown = page.locator(".jp-NotebookPanel .jp-Notebook").first.text_content() or ""
        for broken in BROKEN_WIDGET:
            assert broken not in shown, f"a widget did not render: {broken!r} is on the page"
        shapes.screenshot(path=ARTIFACTS / "quickstart-shapes-widget.png")
        # The filter runs in the kernel: the table changing proves the widget's comm works.
        widget.locator(".widget-text input").fill("no-such-name")
        expect(table).to_contain_text("0 names")
        shapes.screenshot(path=ARTIFACTS / "quickstart-shapes-widget-filtered.png")
    finally:
        page.screenshot(path=ARTIFACTS / "quickstart-last-view.png")


@pytest.mark.usefixtures("chromium")
def test_timelines_render_as_widgets_with_their_drawing(lab: Lab, page: Any) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)
    index = cell_indices(TIMELINES)
    try:
        run_all_cells(page, lab, TIMELINES)

        shapes = cell(page, index["shapes"])
        expect(shapes.locator(".jp-OutputArea-output .widget-vbox").first).to_contain_text(
            "[8, 12]"
        )
        step = output_text(cell(page, index["step"]))
        assert_in_order(step, "CollectiveDesyncError", "rank 1 raised RuntimeError", "rank 0")

        timeline = cell(page, index["timeline"])
        assert "wrote timeline.json" in output_text(timeline)
        widget = timeline.locator(".jp-OutputArea-output .widget-vbox").first
        expect(widget).to_be_visible()
        drawing = widget.locator(".widget-html svg").first
        expect(drawing).to_be_visible()
        box = drawing.bounding_box()
        assert box is not None and box["width"] > 200 and box["height"] > 40, box
        expect(widget.locator("svg rect").first).to_be_attached()  # the bars are drawn
        expect(widget).to_contain_text("Stragglers")
        expect(widget).to_contain_text("rank 1")
        timeline.screenshot(path=ARTIFACTS / "timelines-straggler-widget.png")
        # Picking a collective runs in the kernel: each rank's arrival shows, rank 1 last.
        widget.locator(".widget-select select").first.select_option(index=0)
        expect(widget).to_contain_text("rank 1 (last)")
        timeline.screenshot(path=ARTIFACTS / "timelines-straggler-picked.png")
        # the export was written: the next cell read it (then removed it, as notebooks leave
        # nothing behind)
        read = output_text(cell(page, index["trace-file"]))
        assert re.search(r"timeline\.json: [1-9]\d* trace events", read), read
        assert not (lab.root / "timeline.json").exists()

        per_cell = cell(page, index["cell-timeline"])
        expect(per_cell.locator(".widget-vbox .widget-html svg").first).to_be_visible()
        expect(per_cell.locator(".widget-vbox").first).to_contain_text("loss.backward()")
        per_cell.screenshot(path=ARTIFACTS / "timelines-cell-timeline.png")

        shown = page.locator(".jp-NotebookPanel .jp-Notebook").first.text_content() or ""
        for broken in BROKEN_WIDGET:
            assert broken not in shown, f"a widget did not render: {broken!r} is on the page"
    finally:
        page.screenshot(path=ARTIFACTS / "timelines-last-view.png")


@pytest.mark.usefixtures("chromium")
def test_a_ranks_debugger_prompts_in_the_input_box(lab: Lab, page: Any) -> None:
    from playwright.sync_api import expect

    from harness.notebooks import ANSWERS

    expect.set_options(timeout=WAIT_MS)
    index = cell_indices(DEBUGGER)
    try:
        run_all_cells(page, lab, DEBUGGER, wait=False)
        for cell_id in ("stop", "post-mortem"):
            area = cell(page, index[cell_id])
            for n, answer in enumerate(ANSWERS[DEBUGGER][cell_id]):
                open_prompt(page, area)
                expect(area.locator(".jp-Stdin-prompt").last).to_have_text("[rank 1] (Pdb) ")
                if n == 1:
                    area.screenshot(path=ARTIFACTS / f"debugger-{cell_id}.png")
                typed = re.compile(r"\[rank 1\] \(Pdb\)\s+" + re.escape(answer))
                before = len(typed.findall(output_text(area)))
                answer_prompt(page, area, answer)
                deadline = time.monotonic() + WAIT_MS / 1000
                while len(typed.findall(output_text(area))) == before:
                    assert time.monotonic() < deadline, output_text(area)
                    page.wait_for_timeout(50)
        wait_until_last_cell_ran(page)
        stopped = output_text(cell(page, index["stop"]))
        assert_in_order(
            stopped,
            "[rank 1] > cell In[",
            "-> loss.backward()",
            "0.0000])",
            "rank 1 quit the debugger",
        )
        assert "[rank 1] tensor(5.)" in output_text(cell(page, index["post-mortem"]))
    finally:
        page.screenshot(path=ARTIFACTS / "debugger-last-view.png")


# --- JupyterLab ---------------------------------------------------------------------------


# --- the page -----------------------------------------------------------------------------
