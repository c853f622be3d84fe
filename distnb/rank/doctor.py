"""The rank side of `distnb doctor`: device, barrier, a checked all_reduce, bandwidth, and what
this rank's torch leaves unchecked."""

from __future__ import annotations

import os
import socket
import statistics
import time
from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist

from distnb.rank import checked, runtime
from distnb.rank.checked.intercept import resolve
from distnb.rank.checked.ops import OPS, READS_REDUCE_OP, Describe
from distnb.records.doctor import Bandwidth, DoctorReport

# The oldest and newest torch (major, minor) that `make compat` runs the tests on
# (docs/compat.md); pyproject.toml asks for the oldest, and leaves the newest open.
TESTED = ((2, 8), (2, 15))
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


def torch_range(version: str) -> str:
    """Where torch `version` lies against `TESTED`, in words."""
    release = tuple(int(p) for p in version.split("+")[0].split(".")[:2] if p.isdigit())
    (lo_major, lo_minor), (hi_major, hi_minor) = TESTED
    span = f"{lo_major}.{lo_minor} to {hi_major}.{hi_minor}"
    if release < TESTED[0]:
        return f"older than distnb supports ({span}): expect failures"
    if release > TESTED[1]:
        return f"newer than tested ({span}): collective ops distnb does not know go unchecked"
    return f"in the tested range ({span}, docs/compat.md)"


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
