"""JupyterLab's debugger panel on 2 ranks as a user reads it, in a real JupyterLab in a real
Chromium: an expanded tensor's fields show their values; the rank shown is the one without
"(select to show)", also after selecting the other rank; *Next*, *Step In* and *Step Out*,
repeated, keep the panel on the rank shown; after *Terminate* the bug icon says what the kernel's
debugger is (lit and on, as switched on from the page; off and off once the page has shown the
notebook again). Screenshots: artifacts/debug/panel-*.png."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest

from harness.lab import WAIT_MS, Lab, cell, output_text, shot, wait_for_kernel_idle
from tests.browser.test_debugger_clicks import button
from tests.browser.test_visual_debugger import ran, run_cell

pytestmark = [pytest.mark.cluster, pytest.mark.browser]

NAME = "panel-ranks.ipynb"
CELLS = [
    "%load_ext distnb\n%dist_start -n 2",
    "%%allranks\ndef scale(t):\n    u = t * 2\n    return u\nx = torch.ones(3) * (rank + 1)\n"
    "for i in range(3):\n    y = scale(x)\ndist.all_reduce(y)\nprint(rank, y.tolist())",
    "print('debugger on:', get_ipython().kernel.debugger.is_started)",
    "%dist_stop",
]
# (button, the shown rank's top frame after it): from line 3 of scale(), twice round the loop
STEPS = [
    ("Next", "scale", 4),
    ("Step Out", "<module>", 7),
    ("Next", "<module>", 6),
    ("Next", "<module>", 7),
    ("Step In", "scale", 3),
    ("Next", "scale", 4),
    ("Step Out", "<module>", 7),
]


def open_notebook(lab: Lab, page: Any, name: str) -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}  # fmt: skip
    nbformat.write(nb, lab.root / name)
    page.goto(f"{lab.url}/lab/tree/{name}?reset&token={lab.token}", timeout=WAIT_MS)
    wait_for_kernel_idle(page)


def settled(page: Any, dap_log: Path) -> None:
    """Wait until the frontend asked `debugInfo`, then nothing for a second and a half."""
    before = dap_log.read_text()
    while "debugInfo" not in dap_log.read_text()[len(before) :]:
        page.wait_for_timeout(100)
    seen, quiet = "", 0
    while quiet < 15:
        now = dap_log.read_text()
        seen, quiet = now, quiet + 1 if now == seen else 0
        page.wait_for_timeout(100)


def shown_rank(frames: Any) -> int:
    return int(re.search(r"\[rank (\d)\]", frames.first.text_content() or "").group(1))  # type: ignore[union-attr]


@pytest.mark.usefixtures("chromium")  # first: skip before starting JupyterLab
def test_two_ranks_values_label_steps_and_terminate(dap_log: Path, lab: Lab, page: Any) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=90_000)
    open_notebook(lab, page, NAME)
    try:
        run_cell(page, 0)
        ran(page, 0, timeout=240)
        bug = page.locator(".jp-NotebookPanel-toolbar .jp-DebuggerBugButton").first
        bug.click()
        expect(bug).to_have_attribute("title", "Disable Debugger")
        gutter = cell(page, 1).locator(".cm-breakpoint-gutter .cm-gutterElement")
        gutter.nth(3).click()  # line 3: u = t * 2 (element 0 is the gutter's spacer)
        expect(gutter.nth(3).locator(".cm-breakpoint-icon")).to_have_count(1)
        start = time.monotonic()
        run_cell(page, 1)
        frames = page.locator(".jp-DebuggerCallstackFrame")
        expect(frames.first).to_contain_text("[rank ")
        print(f"first stop in the panel: {time.monotonic() - start:.1f} s")

        # (c) the shown rank is the one not offered to select, also once the other is selected
        held = frames.filter(has_text="(select to show)")
        expect(held).to_have_count(1)
        first = shown_rank(frames)
        expect(frames.first).not_to_contain_text("(select to show)")
        held.click()
        expect(frames.first).to_contain_text(f"[rank {1 - first}] scale")
        expect(held).to_contain_text(f"[rank {first}]")
        shot(page, "panel-other-rank-selected")
        shown = 1 - first

        # (a) an expanded tensor's fields, as the tree shows them: names and values
        variables = page.locator(".jp-DebuggerVariables")
        line = rf"t:?\s*Tensor float32\[3\] cpu\s+tensor\(\[{shown + 1}\."
        expect(variables).to_contain_text(re.compile(line))  # the shown rank's, not the last
        variables.get_by_text(re.compile(r"^t$")).first.click()
        expect(variables).to_contain_text(re.compile(r"shape:?\s*\[3\]"))
        expect(variables).to_contain_text(re.compile(r"dtype:?\s*torch\.float32"))
        expect(variables).to_contain_text(re.compile(rf"values:?\s*tensor\(\[{shown + 1}\."))
        shot(page, "panel-tensor-expanded")

        # (d) steps keep the panel on the rank shown, however long each takes
        for name, function, line in STEPS:
            start = time.monotonic()
            button(page, name).click()
            expect(frames.first).to_contain_text(
                re.compile(rf"\[rank {shown}\] {function}.*:{line}\s*$")
            )
            print(f"{name}: {time.monotonic() - start:.1f} s")
        shot(page, "panel-after-steps")

        # (b) after Terminate the bug icon says what the kernel's debugger is. Switched on from
        # this page, the icon stays lit: on, with the breakpoint, which stops the ranks again.
        # After JupyterLab showed the notebook again (another tab and back), the icon goes off.
        for shown_again, title, on in ((False, "Disable Debugger", True),
                                       (True, "Enable Debugger", False)):  # fmt: skip
            if shown_again:
                run_cell(page, 1)
                expect(frames.first).to_contain_text("[rank ")
                page.locator(".lm-TabBar-addButton:not(.lm-mod-hidden)").first.click()
                page.locator(".lm-TabBar-tab", has_text=NAME).first.click()
                settled(page, dap_log)  # JupyterLab has read the debugger's state again
            button(page, "Terminate").click()
            ran(page, 1, timeout=90)
            assert "[rank 1] 1 [" in output_text(cell(page, 1))
            expect(bug).to_have_attribute("title", title)
            run_cell(page, 2)
            expect(cell(page, 2).locator(".jp-OutputArea")).to_have_text(f"debugger on: {on}")
            shot(page, f"panel-terminated-{'shown-again' if shown_again else 'lit'}")
    finally:
        shot(page, "panel-last-view")
        terminate = button(page, "Terminate")
        if terminate.count() and terminate.is_enabled():  # a failure left ranks stopped
            terminate.click()
        run_cell(page, 3)
        ran(page, 3, timeout=60)
