"""Engine kinds: how a session's engines are launched, one object per ipyparallel launcher.

ipyparallel turns a launcher's name (`local`, `mpi`, `ssh`, `slurm`, ...) into a class once;
distnb does the same with what it adds on top. An `EngineKind` is built once, from the options
(`distnb.session.options.engine_kind`), validates itself in its constructor, and knows:

- how many ranks it starts when the user does not say (`ranks`);
- what it gives ipyparallel (`launcher`, `launcher_settings`) and the engines' environment
  (`environment`);
- how long the controller waits for a silent engine (`heart_misses`) and where the profile
  folder must lie (`profile_parent`: one the nodes see, for Slurm);
- how it stands while its engines register (`queued`: a batch job's state) and how it ends
  engines it started elsewhere (`stop`: the hosts that did not answer).

Kinds for other machines live beside this module (`ssh.Ssh`, `slurm.Slurm`).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from distnb.errors import ConfigError, warn

__all__ = [
    "DEFAULT_CPU_RANKS",
    "FORKS",
    "EngineKind",
    "Launcher",
    "Local",
    "Mpi",
    "engine_command",
    "forked_engines",
    "forks_folder",
]

DEFAULT_CPU_RANKS = 2
FORKS = "distnb.rank.forks"  # the module that forks the engines of this machine
# Engines a silent heart monitor drops after this many missed 100 ms beats: 10 s, so that a
# loaded 2-core machine does not lose ranks (a rank that really dies is reported at once by
# its nanny). Engines on other hosts override it (see `ssh.Ssh`).
HEART_MISSES = 100


def engine_command(python: str = "") -> list[str]:
    """distnb's engine (ipyparallel's, with output and stdin wired for ranks)."""
    return [python or sys.executable, "-m", "distnb.rank.engine"]


class EngineKind:
    """How engines are launched (see the module). The base is any launcher ipyparallel knows by
    name whose engines run here, with this Python."""

    name = "local"
    heart_misses = HEART_MISSES
    away = False  # engines may run on other hosts: the environment they get is forwarded

    def ranks(self, n: int | None, backend: str) -> int:
        """The number of ranks: `n`, or the kind's default (one per GPU here, else 2)."""
        return n if n is not None else DEFAULT_CPU_RANKS

    def launcher(self) -> str | type:
        """What ipyparallel's `Cluster(engines=...)` takes: a launcher's name or class."""
        return self.name

    def launcher_settings(self) -> dict[str, Any]:
        """The launcher's own settings beyond ipyparallel's defaults."""
        return {"engine_cmd": engine_command()}

    def environment(self, n: int) -> dict[str, str]:
        """What the engines' environment adds to what their launcher gives them."""
        if self.away:  # the settings of torch's collectives and distnb's own reach other hosts
            return {k: v for k, v in os.environ.items() if k.startswith(FORWARDED)}
        # Ranks on one machine share its cores: give each rank's intra-op threads its share
        # (as torchrun does) unless the user chose.
        if "OMP_NUM_THREADS" in os.environ:
            return {}
        return {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // n))}

    def profile_parent(self) -> str | None:
        """The folder the cluster's profile folder goes in (None: the system's temporary one)."""
        return None

    def queued(self, engine_sets: list[Any]) -> str:
        """While engines register: how a batch job stands ("" when there is none to tell)."""
        return ""

    def stop(self, ipp_cluster: Any) -> list[str]:
        """End the engines the kernel cannot kill itself; return the hosts that did not answer."""
        return []

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


# The kernel's variables that ranks on other hosts get too (local engines inherit them all).
FORWARDED = ("NCCL_", "GLOO_", "TORCH_", "DISTNB_")


class Local(EngineKind):
    """Engines on this machine, forked from one process (`forked_engines`); by default one
    rank per GPU."""

    def __init__(self, n: int | None, backend: str) -> None:
        allocation = os.environ.get("SLURM_JOB_ID", "")
        if allocation and not os.environ.get("SLURMD_NODENAME"):
            warn(  # `salloc` on a login node: its shell runs here, not on the nodes
                f"this kernel runs inside Slurm allocation {allocation} but not on its "
                f"nodes ({os.environ.get('SLURM_JOB_NODELIST', '?')}): these ranks start on "
                "this machine; --engines slurm --host ADDRESS starts them on the allocation's "
                "nodes"
            )
        # Asking torch costs its import (~1 s): only when the answer matters before launching.
        self._gpus = _local_cuda_devices() if n is None or backend == "nccl" else None

    def launcher(self) -> type:
        return forked_engines()

    def launcher_settings(self) -> dict[str, Any]:
        return {"engine_cmd": [sys.executable, "-m", FORKS]}

    def ranks(self, n: int | None, backend: str) -> int:
        gpus = self._gpus
        if n is None:
            n = gpus if gpus and backend != "gloo" else DEFAULT_CPU_RANKS
        if backend == "nccl" and gpus is not None and gpus < n:
            raise ConfigError(
                f"--backend nccl needs one CUDA device per rank: {n} ranks asked, {gpus} CUDA "
                f"device(s) here. Use -n {gpus} or --backend gloo."
                if gpus
                else "--backend nccl needs CUDA, and torch sees no CUDA device here. "
                "Use --backend gloo (or auto)."
            )
        return n


def forked_engines() -> type:
    """ipyparallel's launcher for the engines of this machine, forked from one process that
    imported them once (`distnb.rank.forks`): one process to launch, as mpiexec is, whose
    engines keep their logs and exit statuses in the profile's `forks` folder."""
    from ipyparallel.cluster.launcher import LocalEngineLauncher

    class Forks(LocalEngineLauncher):  # type: ignore[misc]
        def start(self, n: int) -> Any:
            self.n = n
            return super().start()

        def find_args(self) -> list[str]:
            folder = forks_folder(self.profile_dir)
            return [*self.engine_cmd, str(self.n), folder, *self.cluster_args, *self.engine_args]

    return Forks


def forks_folder(profile: str) -> str:
    """Where forked engines keep their logs and exit statuses (`distnb.rank.forks`)."""
    return os.path.join(profile, "forks")


class Mpi(EngineKind):
    """Engines under `mpiexec` (ipyparallel's MPI launcher); rank order follows MPI's."""

    def __init__(self, name: str = "mpi") -> None:
        self.name = name


class Launcher(EngineKind):
    """Any other launcher ipyparallel knows by name (its own settings, its own engine)."""

    def __init__(self, name: str) -> None:
        if not name or not isinstance(name, str):
            raise ConfigError(
                f"engines must name an ipyparallel launcher (local, mpi, slurm, ssh, ...), "
                f"got {name!r}"
            )
        self.name = name

    def launcher_settings(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        return f"Launcher({self.name!r})"


def _local_cuda_devices() -> int:
    from distnb.interrupts import import_whole

    torch: Any = import_whole("torch")  # Ctrl-C must not cut torch's import

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
