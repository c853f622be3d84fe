"""Run folders: a launcher's new folder prunes those of ended runs, the newest kept, and never
touches a run that has not ended."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from distnb.contract.folders import KEEP_ENDED, RUNS_VAR, RunFolder


def test_a_new_run_folder_prunes_ended_runs_but_the_newest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RUNS_VAR, str(tmp_path))
    for i in range(KEEP_ENDED + 5):
        folder = RunFolder.create(f"ended-{i:02d}")
        folder.mark_ended(0)
        os.utime(folder.path / "ended", (1_000_000 + i, 1_000_000 + i))  # ended in this order
    running = [RunFolder.create(f"running-{i}") for i in range(2)]
    os.utime(running[0].path, (1, 1))  # old, but not ended: kept
    RunFolder.create("new")
    left = sorted(p.name for p in tmp_path.iterdir())
    newest = [f"ended-{i:02d}" for i in range(5, KEEP_ENDED + 5)]
    assert left == sorted([*newest, "new", "running-0", "running-1"])
