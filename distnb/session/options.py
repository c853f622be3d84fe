"""How a session starts: its options, checked before anything is launched."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from distnb.errors import ConfigError, DistnbWarning
from distnb.session import slurm
from distnb.session.control import is_loopback
from distnb.session.remote import SSH_OPTIONS

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
    hosts: tuple[tuple[str, int], ...] = ()  # ranks per host, for the ssh launcher
    python: str = ""  # the Python the ssh launcher runs on the hosts: this one's path by default
    ssh_args: tuple[str, ...] = ()  # for ssh and scp: `-i key`, `-J jump`, `-o ...`
    slurm: tuple[str, ...] = ()  # for sbatch, or srun inside an allocation: `-p gpu -t 60`

    def validated(self) -> Options:
        opts = self._slurm_validated()._hosts_validated()
        n = opts.n
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ConfigError(f"n must be a whole number of ranks >= 1, got {n!r}; e.g. -n 2")
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        check_timeout(self.timeout)
        check_timeout(self.register_timeout, "register_timeout", "--register-timeout 300")
        if not opts.engines or not isinstance(opts.engines, str):
            raise ConfigError(
                f"engines must name an ipyparallel launcher (local, mpi, slurm, "
                f"ssh, ...), got {opts.engines!r}"
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
        return replace(opts, n=n)

    def _hosts_validated(self) -> Options:
        """`hosts` as ((name, ranks), ...), checked against `n`, `engines` and `host`."""
        if not self.hosts:
            if self.engines == "ssh":
                raise ConfigError(
                    "--engines ssh needs the hosts and their ranks: --hosts node1:4,node2:4 "
                    "(distnb.start(..., hosts={'node1': 4, 'node2': 4}))"
                )
            return self
        hosts = parse_hosts(self.hosts)
        total = sum(n for _, n in hosts)
        if self.n is not None and self.n != total:
            raise ConfigError(f"-n {self.n} but --hosts names {total} ranks; give one or the other")
        if self.engines not in ("local", "ssh"):
            raise ConfigError(f"--hosts starts ranks over ssh, not with --engines {self.engines}")
        if is_loopback(self.host) and not all(is_loopback(name) for name, _ in hosts):
            raise ConfigError(
                f"ranks on other hosts cannot reach the control plane on {self.host}: name "
                "this machine's address on the network the hosts share, e.g. --host "
                "10.0.0.1 (the ranks' traffic then uses the interface that reaches it)"
            )
        return replace(self, hosts=hosts, n=total, engines="ssh")

    def _slurm_validated(self) -> Options:
        """The Slurm options only with `--engines slurm`; inside an allocation, `n` defaults to
        its tasks; a control plane the nodes can reach."""
        if self.slurm and self.engines != "slurm":
            raise ConfigError("--slurm passes options to sbatch or srun: add --engines slurm")
        if self.engines == "local" and slurm.allocation() and not os.environ.get("SLURMD_NODENAME"):
            warnings.warn(  # `salloc` on a login node: its shell runs here, not on the nodes
                f"this kernel runs inside Slurm allocation {slurm.allocation()} but not on its "
                f"nodes ({os.environ.get('SLURM_JOB_NODELIST', '?')}): these ranks start on this "
                "machine; --engines slurm --host ADDRESS starts them on the allocation's nodes",
                DistnbWarning,
                stacklevel=6,
            )
        if self.engines != "slurm":
            return self
        n = self.n
        if n is None and os.environ.get("SLURM_NTASKS", "").isdigit() and slurm.allocation():
            n = int(os.environ["SLURM_NTASKS"])
        on_this_node = os.environ.get("SLURM_JOB_NUM_NODES") == "1" and os.environ.get(
            "SLURMD_NODENAME"
        )
        if is_loopback(self.host) and not on_this_node:
            raise ConfigError(
                f"ranks on Slurm's nodes cannot reach the control plane on {self.host}: name "
                "this machine's address on the network the nodes share, e.g. --host 10.0.0.1"
            )
        return replace(self, n=n)

    def launcher_settings(self) -> dict[str, Any]:
        """What the ipyparallel launcher needs beyond the defaults (ssh: the hosts, the remote
        Python and distnb's engine on it, ssh's and scp's arguments; Slurm: distnb's engine and
        the user's options)."""
        python = self.python or sys.executable
        if self.engines == "slurm":
            return slurm.settings(self.slurm, python)
        if self.engines != "ssh":
            return {}
        ssh_args = [*self.ssh_args, *SSH_OPTIONS]
        return {
            "engines": dict(self.hosts),
            "remote_python": python,
            "engine_cmd": [python, "-m", "distnb.rank.engine"],
            "ssh_args": ssh_args,
            "scp_args": ssh_args,
        }


def parse_hosts(
    hosts: str | Mapping[str, int] | tuple[tuple[str, int], ...],
) -> tuple[tuple[str, int], ...]:
    """`"a:4,b:4"`, `{"a": 4, "b": 4}` or (("a", 4), ("b", 4)) as the last; a host without a
    count gets one rank."""
    pairs: list[tuple[str, object]] = []
    if isinstance(hosts, str):
        for item in filter(None, (h.strip() for h in hosts.split(","))):
            host, _, ranks_text = item.rpartition(":") if ":" in item else (item, "", "1")
            pairs.append((host, ranks_text))
    else:
        pairs.extend(hosts.items() if isinstance(hosts, Mapping) else hosts)
    result = []
    for name, count in pairs:
        try:
            ranks = int(str(count))
        except ValueError:
            ranks = 0
        if not name or ranks < 1:
            raise ConfigError(
                f"hosts must be name:ranks pairs with ranks >= 1, e.g. node1:4,node2:4; got "
                f"{name!r}:{count!r}"
            )
        result.append((str(name), ranks))
    return tuple(result)


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


# The kernel's variables that ranks on other hosts get too (local engines inherit them all):
# the settings of torch's collectives and distnb's own.
FORWARDED = ("NCCL_", "GLOO_", "TORCH_", "DISTNB_")


def engine_env(n: int, engines: str = "local") -> dict[str, str]:
    """What the engines' environment adds to what their launcher gives them."""
    if engines in ("ssh", "slurm"):
        return {k: v for k, v in os.environ.items() if k.startswith(FORWARDED)}
    # Ranks on one machine share its cores: give each rank's intra-op threads its share (as
    # torchrun does) unless the user chose.
    env = {}
    if "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // n))
    return env
