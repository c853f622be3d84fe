"""JupyterLab's visual debugger on the ranks, in a real JupyterLab in a real Chromium: the bug
icon on, a breakpoint clicked into the gutter of an `%%allranks` cell, the cell run; the call
stack shows the ranks' frames, the variables panel a rank's tensors, *Next* steps a rank and
*Continue* lets each go. Screenshots go to artifacts/browser/visual-*.png."""

from __future__ import annotations

import contextlib
import re
import time
from typing import Any

import nbformat
import pytest

from harness.lab import (
    ARTIFACTS,
    WAIT_MS,
    Lab,
    cell,
    output_text,
    wait_for_kernel_idle,
)

pytestmark = [pytest.mark.cluster, pytest.mark.browser]

NAME = "visual-debugger.ipynb"
CELLS = [
    "%load_ext distnb\n%dist_start -n 2",
    "%%allranks\nx = torch.ones(3) * (rank + 1)\ny = x * 2\ndist.all_reduce(y)\n"
    "print(rank, y.tolist())",
    "%dist_stop",
]


def run_cell(page: Any, index: int) -> None:
    cell(page, index).locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")


def ran(page: Any, index: int, timeout: float = 120) -> None:
    prompt = cell(page, index).locator(".jp-InputPrompt")
    deadline = time.monotonic() + timeout
    while not re.search(r"\[\d+\]", prompt.text_content() or ""):
        assert time.monotonic() < deadline, f"cell {index} did not run"
        page.wait_for_timeout(100)


@pytest.mark.usefixtures("chromium")  # first: skip before starting JupyterLab
def test_a_gutter_breakpoint_stops_the_ranks_in_jupyterlabs_debugger(lab: Lab, page: Any) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, lab.root / NAME)
    page.goto(f"{lab.url}/lab/tree/{NAME}?reset&token={lab.token}", timeout=WAIT_MS)
    wait_for_kernel_idle(page)
    try:
        run_cell(page, 0)
        ran(page, 0)
        page.locator(".jp-NotebookPanel-toolbar .jp-DebuggerBugButton").click()
        expect(page.locator(".jp-DebuggerCallstack")).to_be_visible()
        page.screenshot(path=ARTIFACTS / "visual-enabled.png")
        gutter = cell(page, 1).locator(".cm-breakpoint-gutter .cm-gutterElement")
        gutter.nth(3).click()  # line 3 (the first element is the gutter's hidden spacer)
        expect(gutter.nth(3).locator(".cm-breakpoint-icon")).to_have_count(1)
        run_cell(page, 1)
        frames = page.locator(".jp-DebuggerCallstackFrame")
        expect(frames.first).to_contain_text(re.compile(r"\[rank [01]\] <module>"))
        page.screenshot(path=ARTIFACTS / "visual-stopped.png")
        variables = page.locator(".jp-DebuggerVariables")
        expect(variables).to_contain_text("float32[3] cpu")
        expect(frames.first).to_contain_text("Cell [*]:3")
        page.locator('button[title^="Next"]').click()
        expect(frames.first).to_contain_text("Cell [*]:4")  # the shown rank stepped one line
        page.screenshot(path=ARTIFACTS / "visual-next.png")
        # each rank's stop, one at a time, until the cell has run; the Continue button is
        # there only while a rank is stopped (JupyterLab shows Pause instead while they run)
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        continue_button = page.locator('button[title^="Continue"]')
        deadline = time.monotonic() + 120
        while not re.search(
            r"\[\d+\]", cell(page, 1).locator(".jp-InputPrompt").text_content() or ""
        ):
            assert time.monotonic() < deadline, "cell 1 did not run to its end"
            if continue_button.count() and continue_button.is_enabled():
                # the last rank's Continue ends the cell: the button may go before the click
                with contextlib.suppress(PlaywrightTimeout):
                    continue_button.click(timeout=5_000)
            page.wait_for_timeout(500)
        text = output_text(cell(page, 1))
        assert "[rank 0] 0 [6.0, 6.0, 6.0]" in text and "[rank 1] 1 [6.0, 6.0, 6.0]" in text, text
    finally:
        page.screenshot(path=ARTIFACTS / "visual-last-view.png")
        run_cell(page, 2)
        ran(page, 2, timeout=60)
