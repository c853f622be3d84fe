"""The guide's DDP script under `torchrun --standalone` on 2 ranks, timed: the peer that
bench_runs and bench_faults measure `%dist_run` against.

torch 2.13's gloo sometimes aborts a worker at exit ("terminate called without an active
exception") after the script printed its result; such a run is run again, and counted.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

__all__ = ["torchrun_seconds"]


def torchrun_seconds(script: Path, tries: int = 3) -> tuple[float, int]:
    """(seconds of the first run that ended well, runs lost to the exit-time abort)."""
    command = [str(Path(sys.executable).parent / "torchrun"), "--standalone"]
    command += ["--nproc-per-node", "2", str(script), "--steps", "4"]
    for lost in range(tries):
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        took = time.perf_counter() - started
        if done.returncode == 0:
            assert "weights" in done.stdout, done.stdout
            return took, lost
        assert "terminate called without an active exception" in done.stderr, done.stderr
    raise AssertionError(f"torchrun failed {tries} times:\n{done.stderr[-3000:]}")
