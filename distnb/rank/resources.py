"""What this rank runs with, for `%dist_status`: memory, CUDA memory, intra-op threads,
environment.

Cheap enough to ask at every `%dist_status` (~0.1 ms): one read of /proc through psutil, the
caching allocator's counters (no device sync) and a scan of `os.environ`.
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Mapping

import psutil
import torch

from distnb.records.resources import CudaMemory, RankResources

__all__ = ["ENV_NAMES", "ENV_PREFIXES", "distributed_env", "probe"]

# Variables that change how collectives, devices or threads behave.
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "GLOO_", "TORCH_GLOO_")
ENV_NAMES = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_LAUNCH_BLOCKING",
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "PYTORCH_CUDA_ALLOC_CONF",
    "TORCH_CPP_LOG_LEVEL",
    "TORCH_SHOW_CPP_STACKTRACES",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def probe(rank: int) -> RankResources:
    """This rank's resources now."""
    return RankResources(
        rank=rank,
        rss=int(psutil.Process().memory_info().rss),
        peak_rss=_peak_rss(),
        intra_op_threads=torch.get_num_threads(),
        cuda=_cuda_memory(),
        env=distributed_env(os.environ),
    )


def distributed_env(environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The variables of `environ` that `ENV_PREFIXES` and `ENV_NAMES` select, sorted."""
    return tuple(
        sorted(
            (name, value)
            for name, value in environ.items()
            if name in ENV_NAMES or name.startswith(ENV_PREFIXES)
        )
    )


def _peak_rss() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # Linux counts KiB


def _cuda_memory() -> CudaMemory | None:
    """None without CUDA, or before this process made a CUDA context (asking would make one)."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return None
    index = torch.cuda.current_device()
    return CudaMemory(
        device=f"cuda:{index}",
        allocated=torch.cuda.memory_allocated(index),
        reserved=torch.cuda.memory_reserved(index),
        peak=torch.cuda.max_memory_allocated(index),
        total=torch.cuda.get_device_properties(index).total_memory,
    )
