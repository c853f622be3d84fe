"""Engines through Slurm (the `Slurm` kind): a job step inside an allocation, or a job of their own.

Inside an allocation (`salloc`, an `sbatch` script: `SLURM_JOB_ID` is set) the engines are one
`srun` step of it, run by ipyparallel's MPI launcher with `srun` for `mpiexec`: srun is the
kernel's child, so its death is seen at once, and ending it ends the step's tasks on every node.
Anywhere else they are a job of their own, submitted with ipyparallel's Slurm launcher
(`sbatch` running `srun`). Either way the user's Slurm options (`--partition`, `--time`,
`--account`, `--gres`, ...) go to that one command, as they would type them.

Each task of that srun is a rank, placed and numbered by Slurm: the user's options say how many
tasks a node gets (`--ntasks-per-node 2`, `-N 2`, `-m cyclic`), and without them Slurm spreads
the `n` tasks over the allocation as it does any step's; rank r is task r (`SLURM_PROCID`), on
the node Slurm put task r on. distnb does not place ranks itself, so they land where the same
srun of engines started alone would put them, holding the same resources. What changes is what a
task runs (`distnb.rank.slurm_tasks`): on each node the first task imports torch once and forks
one engine per task of the node, each with that task's environment and CPUs; the node's other
tasks hand their places over and hold them until the forker ends. So a start costs one torch
import per node, as over ssh, and the engines' logs and exit statuses stay in the profile's
`forks/NODE/` folders (a failed engine's last lines also go to the job's output).

A submitted job is watched while its engines register: pending, it is shown with Slurm's reason;
ended (a wrong option the queue only refuses later, a node failure, an engine that cannot
start), it is named at once with its output instead of after the register timeout. Slurm's
commands are bounded in time here, so a controller that does not answer holds nothing for long.

The engines read the controller's connection file and the job writes its output in the profile
folder, so that folder must be seen by the nodes: it lies in the IPython folder (the user's
home, shared on clusters), not in /tmp.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from distnb.errors import ConfigError, warn
from distnb.session.cluster.engines import DEFAULT_CPU_RANKS, EngineKind, forks_folder
from distnb.session.cluster.teardown import LIFELINE_BOUND_S
from distnb.session.control import is_loopback

__all__ = ["Slurm", "allocation", "parse_args", "shared_folder", "waiting"]

_COMMAND_S = 10.0  # a Slurm command (sbatch, squeue, scancel) that takes longer has failed
# States in which a job will never run engines (squeue's long names).
_ENDED = {
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "REVOKED",
    "TIMEOUT",
}
TASKS = "distnb.rank.slurm_tasks"  # what srun runs as each task: the node's forker, or a holder
_GONE = ("already completing or completed", "Invalid job id")  # scancel: nothing to cancel


class Slurm(EngineKind):
    """Ranks through Slurm: `args` are the user's options for srun inside an allocation, for
    sbatch elsewhere (`"--partition gpu --time 1:00:00"`, or a list); `python` the nodes' (this
    one's path by default, as on a shared home)."""

    name = "slurm"
    heart_misses = 30  # as for ssh: a node cut off is only told by the heartbeat's silence
    away = True

    def __init__(
        self, args: str | Sequence[str], host: str, n: int | None = None, python: str = ""
    ) -> None:
        on_this_node = os.environ.get("SLURM_JOB_NUM_NODES") == "1" and os.environ.get(
            "SLURMD_NODENAME"
        )
        if is_loopback(host) and not on_this_node:
            raise ConfigError(
                f"ranks on Slurm's nodes cannot reach the control plane on {host}: name "
                "this machine's address on the network the nodes share, e.g. --host 10.0.0.1"
            )
        self.args = parse_args(args)
        self.python = python or sys.executable

    def ranks(self, n: int | None, backend: str) -> int:
        """`n`; inside an allocation, its tasks by default."""
        if n is None and os.environ.get("SLURM_NTASKS", "").isdigit() and allocation():
            return int(os.environ["SLURM_NTASKS"])
        return n if n is not None else DEFAULT_CPU_RANKS

    def launcher(self) -> type:
        return _engine_set()

    def launcher_settings(self) -> dict[str, Any]:
        """distnb's forker of engines (see the module), and the user's options for srun or
        sbatch."""
        engine_cmd = [self.python, "-m", TASKS]
        if allocation():
            return {"engine_cmd": engine_cmd, "mpi_cmd": ["srun"], "mpi_args": list(self.args)}
        return {"engine_cmd": engine_cmd, "submit_command": ["sbatch", *self.args]}

    def profile_parent(self) -> str:
        return shared_folder()

    def queued(self, engine_sets: list[Any]) -> str:
        return waiting(engine_sets)

    def __repr__(self) -> str:
        return f"Slurm(args={self.args!r})"


def allocation() -> str:
    """The id of the Slurm allocation this kernel runs in, or ""."""
    return os.environ.get("SLURM_JOB_ID", "")


def parse_args(args: str | Sequence[str]) -> tuple[str, ...]:
    """The user's Slurm options: `"-p gpu -t 1:00:00"` (split as a shell does) or a list."""
    return tuple(shlex.split(args)) if isinstance(args, str) else tuple(map(str, args))


def shared_folder() -> str:
    """Where a Slurm cluster's profile folder goes: one the nodes see (see the module)."""
    from IPython.paths import get_ipython_dir

    folder = os.path.join(get_ipython_dir(), "distnb")
    os.makedirs(folder, exist_ok=True)
    return folder


def _engine_set() -> type:
    """ipyparallel's launcher of the engines: an srun step, or an sbatch job (see the module)."""
    if allocation():
        from ipyparallel.cluster.launcher import MPIEngineSetLauncher

        class Step(MPIEngineSetLauncher):  # type: ignore[misc]
            @property
            def program(self) -> list[str]:
                return _program(self)  # no `--mpi`: srun starts no MPI

        return Step
    from ipyparallel.cluster.launcher import SlurmEngineSetLauncher

    class Job(SlurmEngineSetLauncher):  # type: ignore[misc]
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            # In the profile folder, not the kernel's working folder (ipyparallel's place).
            self.batch_file = os.path.join(self.profile_dir, self.batch_file_name)
            self.program = _program(self)

        def _run_command(self, command: list[str], **kwargs: Any) -> str:
            return _run(command, env=kwargs.get("env"))

        def stop(self) -> Any:
            try:
                return super().stop()
            except RuntimeError as exc:
                if not any(word in str(exc) for word in _GONE):
                    warn(
                        f"Slurm job {self.job_id} was not cancelled: {exc}. Its ranks end by "
                        f"themselves within {LIFELINE_BOUND_S:.0f} s of losing the kernel."
                    )
                return ""

    return Job


def _program(launcher: Any) -> list[str]:
    """What srun runs as each task: one of a step's tasks (see the module), and where the
    forked engines keep their logs."""
    return [*launcher.engine_cmd, forks_folder(launcher.profile_dir)]


def waiting(engine_sets: list[Any]) -> str:
    """While engines register: how their submitted job stands (`Slurm job 12 is pending
    (Resources)`), or "" (no job, or running). Raises RuntimeError once the job has ended."""
    for engine_set in engine_sets:
        job = getattr(engine_set, "job_id", "")
        if not job or not hasattr(engine_set, "submit_command"):
            continue
        state, _, reason = _state(job).partition(" ")
        if state in ("", *_ENDED):
            log = getattr(engine_set, "output_file", "")
            output = _tail(log)
            raise RuntimeError(
                f"Slurm job {job} {'ended' if not state else state.lower()} before every engine "
                "registered" + (f"; its output ({log}):\n{output}" if output else "")
            )
        if state != "RUNNING":  # pending, configuring, or not known for now
            why = f" ({reason})" if reason and reason != "None" else ""
            return f"Slurm job {job} is {state.lower()}{why}"
    return ""


def _state(job: str) -> str:
    """`PENDING Resources`, `RUNNING None`, ...; "" for a job Slurm no longer lists, `UNKNOWN
    ...` while squeue does not answer (the job may be fine)."""
    try:
        return _run(["squeue", "-h", "-j", job, "-o", "%T %r"]).strip()
    except RuntimeError as exc:
        return "" if "Invalid job id" in str(exc) else f"UNKNOWN {exc}"


def _tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:]).rstrip()
    except OSError:
        return ""


def _run(command: list[str], env: dict[str, str] | None = None) -> str:
    """A Slurm command's output; RuntimeError with what it said if it fails or hangs."""
    try:
        done = subprocess.run(
            command,
            env=env,
            capture_output=True,
            text=True,
            timeout=_COMMAND_S,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        raise RuntimeError(
            f"{command[0]} is not on this machine's PATH: --engines slurm runs Slurm's "
            "commands here (a login node of the cluster, or inside an allocation)"
        ) from None
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"{shlex.join(command)} did not answer within {_COMMAND_S:g} s (is slurmctld up?)"
        ) from None
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} failed: {done.stderr.strip() or done.stdout}")
    return done.stdout
