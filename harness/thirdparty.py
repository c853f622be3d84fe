"""Third-party distributed scripts, run unchanged, and the verdict each gets under torchrun.

The suite is what the installed packages ship that runs on 2 CPU ranks: Accelerate's own test
scripts (`accelerate/test_utils/scripts/`). Nothing else installed here qualifies: torch's
distributed test programs live in `torch.testing._internal` (a test framework of their own),
and the other `__main__` modules under `torch/distributed` (`checkpoint/format_utils.py`,
`flight_recorder/fr_trace.py`, `tensor/_ops/strategy_validation.py`) use no process group.
Left out, with the reason:

- `test_notebook.py`: it launches processes of its own (`notebook_launcher`) whose workers race
  for one queue; under torchrun it failed with "The nut hasn't cracked yet!" on rank 0 and
  "I'm an even process" on rank 1 in one run, and the other way round in the next;
- `external_deps/test_checkpointing.py`, `test_performance.py`, `test_peak_memory_usage.py`,
  `test_ds_*.py`: they need packages not installed here (`evaluate`, `datasets`, DeepSpeed)
  and fail at their first import, as `test_metrics.py`, kept as one of them, does.

`VERDICTS` holds each script's verdict under `torchrun --standalone --nproc-per-node 2` on this
machine (torch 2.13 CPU, gloo, Accelerate `ACCELERATE`), with the environment distnb gives CPU
ranks (`ACCELERATE_USE_CPU=true`, as `accelerate launch --cpu` sets it; without it Accelerate
ignores the process group on a machine without GPUs). `python bench/torchrun_verdicts.py`
derives them again (`torchrun_verdict`) and says where they differ from this table. "hangs":
torchrun had not ended after 240 s (its process group waits 30 minutes).

The scripts change between Accelerate's releases (1.16.0 dropped `external_deps/test_pippy.py`):
constraints.txt keeps this project's machines on `ACCELERATE`, and the test fails on another
release, saying so.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ACCELERATE", "VERDICTS", "Verdict", "script_path", "torchrun_verdict"]

ACCELERATE = "1.15.0"  # the release whose scripts `VERDICTS` judges


@dataclass(frozen=True)
class Verdict:
    """How a run ended: "pass", "fail" (each failing rank's exception: its type's name, and
    the start of its message) or "hangs"."""

    outcome: str
    errors: tuple[tuple[int, str], ...] = ()

    def __str__(self) -> str:
        if not self.errors:
            return self.outcome
        return f"{self.outcome}: " + "; ".join(f"rank {r} {e}" for r, e in self.errors)

    def matches(self, other: Verdict) -> bool:
        """Same outcome, the same failing ranks, and each one's exception starts as this one's
        does (what a run with `%dist_run` must give: every rank's error comes back)."""
        return len(self.errors) == len(other.errors) and self.allows(other)

    def allows(self, other: Verdict) -> bool:
        """Same outcome, and each of `other`'s failing ranks failed as here. A torchrun run
        may show fewer: once a worker fails, torchrun ends the others, which may not have
        written their traceback yet."""
        if self.outcome != other.outcome or (self.errors and not other.errors):
            return False
        mine = dict(self.errors)
        return all(rank in mine and error.startswith(mine[rank]) for rank, error in other.errors)


PASS = Verdict("pass")
HANGS = Verdict("hangs")


def _both(error: str) -> Verdict:
    return Verdict("fail", ((0, error), (1, error)))


DDP_ON_CPU = (
    "ValueError: DistributedDataParallel device_ids and output_device arguments only work "
    "with single-device/multiple-device GPU modules or CPU modules"
)
VERDICTS: dict[str, Verdict] = {
    "test_cli.py": PASS,
    "test_ops.py": PASS,
    "test_sync.py": PASS,
    "test_script.py": PASS,
    "external_deps/test_pippy.py": PASS,
    "test_merge_weights.py": _both("KeyError: None"),
    "test_ddp_comm_hook.py": _both(DDP_ON_CPU),
    "external_deps/test_metrics.py": _both("ModuleNotFoundError: No module named 'datasets'"),
    "external_deps/test_zero3_integration.py": _both(
        "SkipTest: test requires the Hugging Face suite"
    ),
    # its DDP model meets uneven batches (`join_uneven_inputs` has no effect on CPU): rank 0
    # broadcasts for its next forward while rank 1, out of batches, waits at a barrier
    "test_distributed_data_loop.py": HANGS,
}


def script_path(name: str) -> Path:
    """The installed Accelerate's script `name` (relative to its scripts folder)."""
    spec = importlib.util.find_spec("accelerate")
    assert spec is not None and spec.submodule_search_locations, "accelerate is not installed"
    return Path(next(iter(spec.submodule_search_locations))) / "test_utils" / "scripts" / name


# an exception's last line in a traceback: `[rank0]: module.Name: message` or `Name`
_EXCEPTION = re.compile(r"^(?:\[rank\d+\]: )?(?:[\w.]+\.)?(\w+)(?:: (.*))?$")


def torchrun_verdict(script: Path, logs: Path, timeout: float = 240) -> Verdict:
    """Run `script` under `torchrun --standalone --nproc-per-node 2` (each rank's output in its
    own file under `logs`) and read its verdict: "hangs" past `timeout` seconds."""
    torchrun = Path(sys.executable).parent / "torchrun"
    command = [str(torchrun), "--standalone", "--nproc-per-node", "2", "--redirects", "3"]
    command += ["--log-dir", str(logs), str(script)]
    env = {**os.environ, "ACCELERATE_USE_CPU": "true"}
    try:
        done = subprocess.run(command, capture_output=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return HANGS
    if done.returncode == 0:
        return PASS
    errors = []
    for rank in (0, 1):
        error = _last_exception(next(logs.glob(f"*/attempt_0/{rank}/stderr.log")).read_text())
        if error:
            errors.append((rank, error))
    return Verdict("fail", tuple(errors))


def _last_exception(stderr: str) -> str:
    """`KeyError: None` from a rank's stderr: the line that ends its last traceback."""
    lines = stderr.splitlines()
    starts = [
        i for i, line in enumerate(lines) if line.endswith("Traceback (most recent call last):")
    ]
    if not starts:
        return ""
    for line in lines[starts[-1] + 1 :]:
        text = re.sub(r"^\[rank\d+\]: ", "", line)
        if text and not text[0].isspace() and (match := _EXCEPTION.match(text)):
            return f"{match[1]}: {match[2]}" if match[2] is not None else match[1]
    return ""
