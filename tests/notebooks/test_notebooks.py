"""Every notebook in notebooks/, run top to bottom in a real Jupyter kernel.

Each notebook runs through nbclient in a fresh "python3" kernel (this environment's Python), or,
when its cells ask for input (a debugger's prompt), through a frontend that types the answers in
`ANSWERS` (nbclient cannot answer input requests; harness/notebooks.py). Only cells tagged
`raises-exception` may raise, and each of them must. `CHECKS` says what each notebook's key cells
show; a new notebook adds one line there. After the notebook, the kernel is
shut down and every process it started (ranks, controller, nannies, `!` commands and theirs) must
be gone.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psutil
import pytest

from harness.notebooks import (
    ANSWERS,
    CHECKS,
    EXIT_WAIT_S,
    NOTEBOOKS,
    RAISES,
    assert_contains,
    cells_matching,
    notebook_paths,
    run_answering,
    run_nbclient,
)
from harness.processes import describe, kill, still_running


def test_every_notebook_has_checks_and_is_stored_clean() -> None:
    import nbformat

    names = [p.name for p in notebook_paths()]
    assert names, f"no notebooks in {NOTEBOOKS}"
    assert sorted(CHECKS) == names, "CHECKS must list exactly the notebooks in notebooks/"
    for path in notebook_paths():
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        assert nb.metadata["kernelspec"]["name"] == "python3", path.name
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, (
                    f"{path.name} cell {cell.get('id')}: store notebooks with outputs cleared"
                )
        for selector, _ in CHECKS[path.name]:
            assert cells_matching(nb, selector), f"{path.name}: no cell matches {selector!r}"


@pytest.mark.cluster
@pytest.mark.notebook
@pytest.mark.parametrize("path", notebook_paths(), ids=lambda p: p.stem)
def test_notebook_runs_in_a_kernel(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nbformat

    checks = CHECKS.get(path.name)
    assert checks is not None, f"add a line for {path.name} to CHECKS in harness/notebooks.py"
    # however the notebook is run: a kernel whose PATH lacks this environment's scripts (no
    # `distnb`, no `torchrun`) runs it alike, its shell commands calling `sys.executable`
    scripts = str(Path(sys.executable).parent)
    path_dirs = [d for d in os.environ["PATH"].split(os.pathsep) if d != scripts]
    monkeypatch.setenv("PATH", os.pathsep.join(path_dirs))
    nb = nbformat.read(path, as_version=4)
    seen: dict[int, psutil.Process] = {}
    try:
        if path.name in ANSWERS:
            texts, raised = run_answering(nb, ANSWERS[path.name], tmp_path, seen)
        else:
            texts, raised = run_nbclient(nb, tmp_path, seen)
    finally:  # even when a cell failed: nothing may outlive the kernel
        left = still_running(seen.values(), EXIT_WAIT_S)
        kill(left)
    assert not left, f"still running after the kernel shut down: {describe(left)}"

    for index, cell in enumerate(nb.cells):
        if RAISES in cell.metadata.get("tags", []):
            where = f"cell {index} ({cell.get('id')})"
            assert raised[index], f"{where} is tagged {RAISES} but did not raise"
    # the notebook ran in `tmp_path`, as beside itself: it leaves nothing there
    assert not list(tmp_path.iterdir()), f"{path.name} left {sorted(tmp_path.iterdir())}"
    for index, text in enumerate(texts):  # a `!` command that failed fails the run
        assert "command not found" not in text, f"{path.name} cell {index}: {text}"
    for selector, expected in checks:
        text = "\n".join(texts[nb.cells.index(c)] for c in cells_matching(nb, selector))
        assert_contains(text, expected, f"{path.name} cell {selector!r}")
