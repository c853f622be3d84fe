"""JupyterLab's debugger panel on the stopped ranks of a real torchrun job attached from a
notebook, clicked as a user clicks it in a real JupyterLab in a real Chromium: both ranks
stopped at a breakpoint set from the notebook, one shown with its line of the job's script and
its variables, *Next*, *Continue* (the other rank shown), and detach; the job ends as one never
attached. Screenshots: artifacts/debug/attach-*.png."""

from __future__ import annotations

import re
import time
from typing import Any

import nbformat
import pytest

from harness.jobs import TRAIN, job, line_of
from harness.lab import Lab, cell, output_text, shot, wait_for_kernel_idle
from tests.browser.test_visual_debugger import ran, run_cell

pytestmark = [pytest.mark.gloo, pytest.mark.browser]

NAME = "attach-panel.ipynb"
BEFORE = line_of("flat = grads_of(model)")
GRADS = line_of("# the gradients")
WAIT = (
    "deadline = time.monotonic() + 180\n"
    "while [s.state.value for s in job.snapshots()] != ['stopped', 'stopped']:\n"
    "    assert time.monotonic() < deadline, job.snapshots()\n"
    "    time.sleep(0.2)"
)


@pytest.mark.usefixtures("chromium", "dap_log")  # first: skip before starting JupyterLab
def test_attached_ranks_in_jupyterlabs_debugger_panel(tmp_path: Any, lab: Lab, page: Any) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=90_000)
    ready = tmp_path / "READY"
    ready.touch()
    with job(tmp_path, "wait", STEPS="5", READY=str(ready), agent=False) as plain:
        expected = plain.finals()
    ready.unlink()
    with job(tmp_path, "wait", STEPS="5", READY=str(ready)) as jb:
        deadline = time.monotonic() + 120
        while not (jb.folder / "endpoint.json").exists():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        cells = [
            f"%load_ext distnb\nimport time, distnb\njob = distnb.attach({str(jb.folder)!r}, "
            f"timeout=120)\njob.breakpoint('{TRAIN.name}:{BEFORE}', cond='step == 2')",
            WAIT,
            "print(job.panel())",
            "job.detach()",
        ]
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                     "language": "python"}  # fmt: skip
        nbformat.write(nb, lab.root / NAME)
        page.goto(f"{lab.url}/lab/tree/{NAME}?reset&token={lab.token}", timeout=60_000)
        wait_for_kernel_idle(page)
        try:
            run_cell(page, 0)
            ran(page, 0, timeout=180)
            ready.touch()
            run_cell(page, 1)
            ran(page, 1, timeout=200)
            bug = page.locator(".jp-NotebookPanel-toolbar .jp-DebuggerBugButton").first
            bug.click()
            expect(page.locator(".jp-DebuggerCallstack")).to_be_visible()
            run_cell(page, 2)
            ran(page, 2, timeout=120)
            assert "[0, 1]" in output_text(cell(page, 2))

            frames = page.locator(".jp-DebuggerCallstackFrame")
            expect(frames.first).to_contain_text(re.compile(r"\[rank [01]\] main"))
            expect(frames.first).to_contain_text(f"{TRAIN.name}:{BEFORE}")
            shown = int(re.search(r"\[rank (\d)\]", frames.first.text_content() or "").group(1))  # type: ignore[union-attr]
            expect(frames.filter(has_text="(select to show)")).to_have_count(1)
            variables = page.locator(".jp-DebuggerVariables")
            expect(variables).to_contain_text(re.compile(r"step:?\s*int\s*2|step:?\s*2"))
            shot(page, "attach-stopped")

            page.locator('[title^="Next ("]').first.click()
            expect(frames.first).to_contain_text(f"{TRAIN.name}:{GRADS}")
            expect(variables).to_contain_text(re.compile(r"flat:?\s*Tensor float32\[9\] cpu"))
            shot(page, "attach-next")

            page.locator('[title^="Continue ("]').first.click()
            expect(frames.first).to_contain_text(f"[rank {1 - shown}] main")
            expect(frames.first).to_contain_text(f"{TRAIN.name}:{BEFORE}")
            expect(variables).to_contain_text(re.compile(r"flat:?\s*Tensor float32\[9\] cpu"))
            shot(page, "attach-other-rank")

            page.locator(".lm-TabBar-tab", has_text=NAME).first.click()  # back from train.py
            run_cell(page, 3)
            ran(page, 3, timeout=120)
            assert jb.finals() == expected and len(expected) == 2
        finally:
            shot(page, "attach-last-view")
