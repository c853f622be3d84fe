"""%dist_attach from a real Jupyter kernel, and a kernel killed while the job's ranks are
stopped: the job goes on by itself once the notebook's lease stops."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness.jobs import job
from harness.kernel_driver import execute, kernel

pytestmark = [pytest.mark.gloo, pytest.mark.notebook]


def test_a_killed_notebook_leaves_the_job_running(tmp_path: Path) -> None:
    ready = tmp_path / "READY"
    with job(tmp_path, "ok", STEPS="4", READY=str(ready)) as jb:
        deadline = time.monotonic() + 120
        while not (jb.folder / "endpoint.json").exists():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        with kernel() as (km, kc):
            execute(kc, "%load_ext distnb")
            shown = execute(kc, f"%dist_attach {jb.folder}", timeout=180)
            assert shown.status == "ok" and "2 ranks" in shown.text, shown.text
            bad = execute(kc, "%dist_attach --stop --at nowhere")
            assert "at is 'collective', 'step' or 'now', not 'nowhere'" in bad.text
            assert execute(kc, "%dist_attach --stop").status == "ok"
            km.shutdown_kernel(now=True)  # the notebook dies with the ranks about to stop
        ready.touch()
        assert set(jb.finals(timeout_s=120)) == {0, 1}  # stopped, then on by itself
