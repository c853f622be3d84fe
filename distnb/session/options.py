"""How a session starts: its options, checked before anything is launched."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from distnb.errors import ConfigError

BACKENDS = ("auto", "gloo", "nccl")
DEFAULT_CPU_RANKS = 2
REGISTER_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class Options:
    """How a session was started; `restart()` starts again with the same."""

    n: int | None = None
    backend: str = "auto"
    timeout: float | None = None
    engines: str = "local"
    host: str = "127.0.0.1"
    check: bool = True
    progress: bool = True
    register_timeout: float = REGISTER_TIMEOUT_S

    def validated(self) -> Options:
        n = self.n
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ConfigError(f"n must be a whole number of ranks >= 1, got {n!r}; e.g. -n 2")
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        check_timeout(self.timeout)
        check_timeout(self.register_timeout, "register_timeout", "--register-timeout 300")
        if not self.engines or not isinstance(self.engines, str):
            raise ConfigError(
                f"engines must name an ipyparallel launcher (local, mpi, slurm, "
                f"ssh, ...), got {self.engines!r}"
            )
        # Asking torch costs its import (~1 s): only when the answer matters before launching.
        needs_gpus = self.engines == "local" and (n is None or self.backend == "nccl")
        local_gpus = _local_cuda_devices() if needs_gpus else None
        if n is None:
            n = local_gpus if local_gpus and self.backend != "gloo" else DEFAULT_CPU_RANKS
        if self.backend == "nccl" and local_gpus is not None and local_gpus < n:
            raise ConfigError(
                f"--backend nccl needs one CUDA device per rank: {n} ranks asked, "
                f"{local_gpus} CUDA device(s) here. Use -n {local_gpus} or --backend gloo."
                if local_gpus
                else "--backend nccl needs CUDA, and torch sees no CUDA device here. "
                "Use --backend gloo (or auto)."
            )
        return replace(self, n=n)


def check_timeout(
    timeout: float | None, name: str = "timeout", example: str = "--timeout 30"
) -> None:
    if timeout is not None and (isinstance(timeout, bool) or not timeout > 0):
        raise ConfigError(
            f"{name} must be a number of seconds > 0, got {timeout!r}; e.g. {example}"
        )


def _local_cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def engine_env(n: int) -> dict[str, str]:
    # Ranks on one machine share its cores: give each rank's intra-op threads its share (as
    # torchrun does) unless the user chose.
    env = {}
    if "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // n))
    return env
