"""`distnb demo` and `distnb doctor` as a user runs them: real processes, real ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from distnb.rank import doctor

pytestmark = pytest.mark.cluster


def distnb(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "distnb.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def test_doctor_checks_every_rank(tmp_path: Path) -> None:
    done = distnb("doctor", "-n", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "rank 0: host" in out and "rank 1: host" in out and "backend gloo" in out
    assert "GB/s" in out and out.strip().endswith("OK")
    # the ranks' torch: whether the compatibility runs tested it (tested.json), and what it
    # leaves unchecked
    assert f"\ntorch {torch.__version__}: {doctor.torch_range(torch.__version__)}\n" in out
    for gap in doctor.torch_gaps() or ("every collective path distnb knows is checked",):
        assert f"\n  {gap}\n" in out


def test_doctor_fails_clearly_on_a_bad_setup(tmp_path: Path) -> None:
    done = distnb("doctor", "-n", "2", "--backend", "nccl", cwd=tmp_path)
    assert done.returncode == 1
    assert "--backend gloo" in done.stderr


def test_demo_tells_its_stories_and_writes_the_timeline(tmp_path: Path) -> None:
    done = distnb("demo", "--out", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "CollectiveMismatchError: shape mismatch in broadcast" in out
    assert "rank 1 finished the cell without calling all_reduce" in out
    assert "rank 1 skipped all_reduce" in out
    assert "RankTimeoutError" in out and "waiting at barrier" in out
    assert (tmp_path / "out" / "timeline.png").stat().st_size > 1000
    trace = json.loads((tmp_path / "out" / "timeline.json").read_text())
    assert trace["traceEvents"]


@pytest.mark.parametrize("argv", [["--help"], ["-h"], [], ["--nproc-per-node", "2", "--help"]])
def test_the_launchers_help_lists_distnbs_options_then_torchruns(
    tmp_path: Path, argv: list[str]
) -> None:
    runs = tmp_path / "runs"
    done = subprocess.run(
        [sys.executable, "-m", "distnb.run", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "DISTNB_RUNS": str(runs)},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("usage: python -m distnb.run [distnb's options]")
    assert out.index("--distnb-host ADDR") < out.index("--nproc-per-node")  # distnb's first
    assert not runs.exists() or not any(runs.iterdir())  # asking for help starts no job
