"""The rank side of `distnb doctor`: device, barrier, a checked all_reduce, bandwidth."""

from __future__ import annotations

import os
import socket
import statistics
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from distnb.rank import checked, runtime
from distnb.records.doctor import Bandwidth, DoctorReport


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
    )


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
