"""A cold attach: a fresh interpreter (a real IPython shell in a process of its own) attaches to
a real torchrun job, and sees its ranks, without importing torch (`distnb.contract.storewire`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.jobs import START_S, job

pytestmark = pytest.mark.gloo

# the notebook's side: the magics on a real shell, then what it imported and what it showed
KERNEL = textwrap.dedent(
    """
    import io, json, sys, time
    from contextlib import redirect_stdout
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython()
    t = time.perf_counter()
    ip.run_line_magic("load_ext", "distnb")
    loaded = time.perf_counter()
    attach = ip.run_line_magic("dist_attach", sys.argv[1])
    attached = time.perf_counter()
    status = ip.run_line_magic("dist_status", "")
    with redirect_stdout(io.StringIO()):
        ip.run_line_magic("dist_attach", "--detach")
    print(json.dumps({
        "attach": repr(attach),
        "status": repr(status),
        "torch": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")),
        "load_ext_s": loaded - t,
        "attach_s": attached - loaded,
    }))
    """
)


def test_a_fresh_kernel_attaches_without_importing_torch(tmp_path: Path) -> None:
    with job(tmp_path, "hang", STEPS="8", SKIP_AT="3") as jb:
        jb.agents_up()
        env = {**os.environ, "DISTNB_RUNS": str(tmp_path / "runs")}
        done = subprocess.run(
            [sys.executable, "-c", KERNEL, str(jb.folder)],
            capture_output=True,
            text=True,
            env=env,
            timeout=START_S,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        assert seen["torch"] == [], seen["torch"]
        assert "2 ranks" in seen["attach"], seen["attach"]
        for rank in (0, 1):
            assert f"rank {rank}" in seen["status"] or f"\n{rank} " in seen["status"], seen
