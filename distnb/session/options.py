"""How a session starts: its options, parsed once and checked before anything is launched."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from distnb.errors import ConfigError
from distnb.session.cluster.engines import EngineKind, Launcher, Local, Mpi
from distnb.session.cluster.slurm import Slurm
from distnb.session.cluster.ssh import Ssh

__all__ = ["BACKENDS", "REGISTER_TIMEOUT_S", "Options", "check_timeout", "engine_kind"]

BACKENDS = ("auto", "gloo", "nccl")
REGISTER_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    """How a session was started (`distnb.start`'s arguments, parsed); `restart()` starts again
    with the same. Each field is checked when the record is made."""

    n: int
    engines: EngineKind
    backend: str = "auto"
    timeout: float | None = None
    host: str = "127.0.0.1"
    check: bool = True
    progress: bool = True
    register_timeout: float = REGISTER_TIMEOUT_S

    def __post_init__(self) -> None:
        n = self.n
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"n must be a whole number of ranks >= 1, got {n!r}; e.g. -n 2")
        check_backend(self.backend)
        check_timeout(self.timeout)
        check_timeout(self.register_timeout, "register_timeout", "--register-timeout 300")


def engine_kind(
    engines: str,
    *,
    n: int | None,
    backend: str,
    host: str,
    hosts: str | Mapping[str, int] | None,
    python: str,
    ssh_args: Sequence[str],
    slurm: str | Sequence[str],
) -> EngineKind:
    """The engine kind `distnb.start`'s arguments ask for, built once: `--hosts` means ssh,
    and options of one kind with another are refused."""
    check_backend(backend)  # before a kind asks torch for GPUs
    if slurm and engines != "slurm":
        raise ConfigError("--slurm passes options to sbatch or srun: add --engines slurm")
    if hosts and engines not in ("local", "ssh"):
        raise ConfigError(f"--hosts starts ranks over ssh, not with --engines {engines}")
    if hosts or engines == "ssh":
        return Ssh(hosts or (), host, n, python, ssh_args)
    if engines == "slurm":
        return Slurm(slurm, host, n, python)
    if engines == "local":
        return Local(n, backend)
    if engines in ("mpi", "mpiexec"):
        return Mpi(engines)
    return Launcher(engines)


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")


def check_timeout(
    timeout: float | None, name: str = "timeout", example: str = "--timeout 30"
) -> None:
    if timeout is not None and (isinstance(timeout, bool) or not timeout > 0):
        raise ConfigError(
            f"{name} must be a number of seconds > 0, got {timeout!r}; e.g. {example}"
        )
