"""The rank side of `distnb doctor`: device, barrier, a checked all_reduce, bandwidth, and what
this rank's torch leaves unchecked."""

from __future__ import annotations

import json
import os
import re
import socket
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from distnb.rank import checked, runtime
from distnb.rank.checked.intercept import resolve
from distnb.rank.checked.ops import OPS, READS_REDUCE_OP, Describe
from distnb.records.doctor import Bandwidth, DoctorReport

# What the last compatibility runs tested, release by release: written by `.ci/compat`
# (docs/compat.md says the same), never by hand.
TESTED = Path(__file__).with_name("tested.json")
# The namespaces of the collective ops (`ops.OPS`), and their ops that move no data
_NAMESPACES = ("c10d", "_c10d_functional")
_NOT_COLLECTIVES = frozenset(
    {
        "_c10d_functional::wait_tensor",
        "_c10d_functional::wait_tensors",
        "_c10d_functional::_wrap_tensor_autograd",
        "c10d::check_for_nan",
    }
)


def check(sizes: Sequence[int], iters: int = 5) -> DoctorReport:
    """Exercise this rank's device and the process group; report what failed, not raise."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device = runtime.current_device()
    problems: list[str] = []
    try:
        torch.ones(1024, device=device).sum().item()
    except Exception as exc:
        problems.append(f"cannot allocate on {device}: {exc}")
    try:
        dist.barrier()
    except Exception as exc:
        problems.append(f"barrier failed: {exc}")
    try:
        t = torch.full((4,), float(rank + 1), device=device)
        dist.all_reduce(t)
        expected = world * (world + 1) / 2
        if not torch.allclose(t.cpu(), torch.full((4,), expected)):
            problems.append(f"all_reduce gave {t.tolist()}, expected {expected} everywhere")
    except Exception as exc:
        problems.append(f"all_reduce failed: {exc}")
    bandwidth = [] if problems else [_bandwidth(n, iters, device, world) for n in sizes]
    return DoctorReport(
        rank=rank,
        host=socket.gethostname(),
        pid=os.getpid(),
        device=str(device),
        backend=dist.get_backend(),
        versions=_versions(),
        problems=tuple(problems),
        bandwidth=tuple(bandwidth),
        torch_range=torch_range(str(torch.__version__)),
        torch_gaps=torch_gaps(),
    )


def torch_range(version: str, tested: Path = TESTED) -> str:
    """Whether torch `version` is a release the compatibility runs tested, in words: which
    features passed there and when, or which releases were tested instead."""
    record = _tested(tested)
    release = version.split("+")[0]
    runs: list[dict[str, Any]] = record.get("releases", [])
    entry = next((e for e in runs if e["release"] == release), None)
    if entry is not None:
        features = entry["features"]
        failed = sorted(f for f, v in features.items() if v == "failed")
        skipped = sorted(f for f, v in features.items() if str(v).startswith("skipped"))
        passed = sorted(f for f, v in features.items() if v == "passed")
        where = f"(docs/compat.md, {entry['date']}, commit {entry['commit']})"
        if failed:
            return f"tested, and failed for {', '.join(failed)} {where}: expect failures there"
        words = f"tested: {', '.join(passed)} passed on {release} {where}"
        return words + (f"; not run here: {', '.join(skipped)}" if skipped else "")
    listed = ", ".join(e["release"] for e in runs) or "none"
    accepts = str(record.get("accepts", "torch"))
    floor = re.search(r">=\s*([0-9.]+)", accepts)
    if floor is not None and _key(release) < _key(floor.group(1)):
        return f"older than distnb supports ({accepts}; tested: {listed}): expect failures"
    if runs and _key(release) > _key(runs[-1]["release"]):
        return (
            f"not tested: newer than any release tested ({listed}, docs/compat.md); "
            "collective ops distnb does not know go unchecked"
        )
    return f"not tested: the releases tested are {listed} (docs/compat.md)"


def _tested(path: Path) -> dict[str, Any]:
    """tested.json, or nothing tested if a build left it out."""
    try:
        found: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found


def _key(release: str) -> tuple[int, ...]:
    """(2, 9, 1) for 2.9.1, (2, 16, 0) for 2.16.0.dev20270101."""
    return tuple(int(p) for p in release.split(".")[:3] if p.isdigit())


def torch_gaps(ops: Mapping[str, Describe] = OPS) -> tuple[str, ...]:
    """What distnb cannot check with the installed torch, one line each (none: every path).

    The ops of `ops` that are not intercepted (torch lacks them, or changed their schema), the
    collective ops torch has that `ops` does not name, and what torch hides from the kernels."""
    have = {n for n in torch._C._dispatch_get_all_op_names() if n.split("::")[0] in _NAMESPACES}
    skipped = [name for name, describe in ops.items() if resolve(name, describe) is None]
    lacks = [name for name in skipped if name not in have]
    changed = [name for name in skipped if name in have]
    unknown = sorted(have - set(ops) - _NOT_COLLECTIVES)
    gaps = []
    if lacks:
        gaps.append(f"not in this torch, so not intercepted: {', '.join(lacks)}")
    if changed:
        gaps.append(f"a schema distnb cannot read, so not checked: {', '.join(changed)}")
    if unknown:
        gaps.append(f"collective ops distnb does not know, not checked: {', '.join(unknown)}")
    if not READS_REDUCE_OP:
        gaps.append(
            "the reduce op of calls made from C++ (DDP's gradient buckets) is not compared: "
            "this torch does not show it (2.10 and later do)"
        )
    return tuple(gaps)


def _bandwidth(nbytes: int, iters: int, device: torch.device, world: int) -> Bandwidth:
    t = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=device)
    times = []
    with checked.unchecked():
        dist.all_reduce(t)  # warm-up: connections and buffers
        for _ in range(iters):
            start = time.perf_counter()
            dist.all_reduce(t)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    size = t.numel() * 4
    return Bandwidth(size, seconds, 2 * (world - 1) / world * size / seconds / 1e9)


def _versions() -> tuple[tuple[str, str], ...]:
    versions = [("torch", str(torch.__version__))]
    if torch.cuda.is_available():
        versions.append(("cuda", str(torch.version.cuda)))
        nccl = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
        versions.append(
            ("nccl", ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl))
        )
    return tuple(versions)
