"""JupyterLab's debugger on 4 ranks, clicked as a user clicks it, in a real JupyterLab in a real
Chromium: four ranks stopped at one gutter breakpoint, the panel on one of them without jumping
to another; a tensor's line and its expanded list in *Variables*; selecting another rank's frame;
*Step In* to a function of a cell run before the debugger was on; *Terminate*, after which the
bug icon, the gutter and the kernel agree that the debugger is on with its breakpoint.
Screenshots: artifacts/debug/*.png."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import nbformat
import pytest

from harness.lab import WAIT_MS, Lab, cell, output_text, shot, wait_for_kernel_idle
from tests.browser.test_visual_debugger import ran, run_cell

pytestmark = [pytest.mark.cluster, pytest.mark.browser]

NAME = "debugger-clicks.ipynb"
CELLS = [
    "%load_ext distnb\n%dist_start -n 4",
    "%%allranks\ndef scale(t):\n    u = t * 2\n    return u",
    "%%allranks\nx = torch.ones(3) * (rank + 1)\nbig = torch.arange(64.0).reshape(16, 4)\n"
    "y = scale(x)\ndist.all_reduce(y)\nprint(rank, y.tolist())",
    "%dist_stop",
]
DONE = [f"[rank {r}] {r} [20.0, 20.0, 20.0]" for r in range(4)]


def tensor_line(k: int) -> re.Pattern[str]:
    """x's line in the Variables tree (its colon is the stylesheet's):
    `x: Tensor float32[3] cpu  tensor([k., k., k.])`."""
    return re.compile(rf"x:?\s*Tensor float32\[3\] cpu\s+tensor\(\[{k}\., {k}\., {k}\.\]\)")


def button(page: Any, name: str) -> Any:
    """A button of the debugger's call stack toolbar, by its title: `Step In (F11)`."""
    return page.locator(f'[title^="{name} ("]').first


def open_notebook(lab: Lab, page: Any) -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    spec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["kernelspec"] = spec
    nbformat.write(nb, lab.root / NAME)
    page.goto(f"{lab.url}/lab/tree/{NAME}?reset&token={lab.token}", timeout=WAIT_MS)
    wait_for_kernel_idle(page)


@pytest.mark.usefixtures("chromium")  # first: skip before starting JupyterLab
def test_four_ranks_variables_step_in_and_terminate(dap_log: Path, lab: Lab, page: Any) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=90_000)
    console: list[str] = []
    page.on("console", lambda msg: console.append(msg.text))
    open_notebook(lab, page)
    try:
        run_cell(page, 0)
        ran(page, 0, timeout=240)
        run_cell(page, 1)  # defines scale(), with the debugger off
        ran(page, 1)
        bug = page.locator(".jp-NotebookPanel-toolbar .jp-DebuggerBugButton").first
        bug.click()
        expect(page.locator(".jp-DebuggerCallstack")).to_be_visible()
        expect(bug).to_have_attribute("title", "Disable Debugger")
        gutter = cell(page, 2).locator(".cm-breakpoint-gutter .cm-gutterElement")
        gutter.nth(4).click()  # line 4: y = scale(x) (element 0 is the gutter's spacer)
        expect(gutter.nth(4).locator(".cm-breakpoint-icon")).to_have_count(1)
        run_cell(page, 2)

        # four ranks stop; the panel shows one and lists the three others to select
        frames = page.locator(".jp-DebuggerCallstackFrame")
        held = frames.filter(has_text="(select to show)")
        expect(held).to_have_count(3)
        first = frames.first.text_content() or ""
        shown = int(re.search(r"\[rank (\d)\] <module>", first).group(1))  # type: ignore[union-attr]
        page.wait_for_timeout(2000)  # the panel does not change rank on its own
        assert frames.first.text_content() == first
        expect(frames.first).to_contain_text("Cell [*]:4")
        shot(page, "four-ranks-stopped")

        # a tensor's line, and its list when expanded: no debugpy attribute walk
        variables = page.locator(".jp-DebuggerVariables")
        expect(variables).to_contain_text(tensor_line(shown + 1))
        expect(variables).to_contain_text(
            re.compile(r"big:?\s*Tensor float32\[16, 4\] cpu\s+min 0 max 63 mean 31.5")
        )
        variables.get_by_text(re.compile(r"^big")).first.click()
        expect(variables).to_contain_text("requires_grad")
        expect(variables).to_contain_text("first 8")
        assert "Traceback" not in (variables.text_content() or "")
        assert "only supported on matrices" not in (variables.text_content() or "")
        shot(page, "variables-tensor")

        # selecting another rank's frame shows that rank
        other = held.first
        other_rank = int(re.search(r"\[rank (\d)\]", other.text_content() or "").group(1))  # type: ignore[union-attr]
        other.click()
        expect(variables).to_contain_text(tensor_line(other_rank + 1))
        shot(page, "other-rank-selected")

        # Step In to scale(), defined by a cell run before the debugger was on: its source
        button(page, "Step In").click()
        expect(frames.first).to_contain_text(f"[rank {other_rank}] scale")
        expect(frames.first).to_contain_text(re.compile(r"Cell \[\d+\]:3"))
        highlighted = cell(page, 1).locator(".jp-DebuggerEditor-highlight")
        expect(highlighted).to_have_count(1)
        expect(highlighted).to_contain_text("u = t * 2")
        shot(page, "step-in-earlier-cell")

        # Terminate: every rank goes on; the bug icon stays lit and the gutter shows the
        # breakpoint again: the kernel's debugger stays on with it, and it stops the ranks
        button(page, "Terminate").click()
        ran(page, 2, timeout=90)
        text = output_text(cell(page, 2))
        assert all(line in text for line in DONE), text
        expect(bug).to_have_attribute("title", "Disable Debugger")
        expect(gutter.nth(4).locator(".cm-breakpoint-icon")).to_have_count(1)
        shot(page, "terminated")
        requests = [line.split()[1:] for line in dap_log.read_text().splitlines()]
        after = requests[[r[0] for r in requests].index("disconnect") :]
        assert [r[0] for r in after[:2]] == ["disconnect", "initialize"] and after[1][-1] == "True"
        run_cell(page, 2)
        expect(frames.first).to_contain_text("Cell [*]:4")
        shot(page, "on-again")
        # and off: the stopped ranks go on, the cell ends
        bug.click()
        expect(bug).to_have_attribute("title", "Enable Debugger")
        ran(page, 2, timeout=90)
        assert all(line in output_text(cell(page, 2)) for line in DONE)
        assert not [m for m in console if "Failed to fetch source" in m], console
    finally:
        shot(page, "last-view")
        run_cell(page, 3)
        ran(page, 3, timeout=60)
