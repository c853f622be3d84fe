"""Starting a session: `start`, the one way a session begins (`distnb.start`, `%dist_start`),
its options checked and parsed once (`options`) before any process starts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from distnb.session.core import Session
from distnb.session.options import REGISTER_TIMEOUT_S, Options, engine_kind

__all__ = ["start"]


def start(
    n: int | None = None,
    *,
    backend: str = "auto",
    timeout: float | None = None,
    engines: str = "local",
    host: str = "127.0.0.1",
    check: bool = True,
    progress: bool = True,
    register_timeout: float = REGISTER_TIMEOUT_S,
    hosts: str | Mapping[str, int] | None = None,
    python: str = "",
    ssh_args: Sequence[str] = (),
    slurm: str | Sequence[str] = (),
) -> Session:
    """Start `n` ranks and return the running `Session` (`%dist_start` calls this).

    `n`: ranks (default: one per local GPU, else 2). `backend`: `"auto"` (NCCL when every rank
    has a GPU of its own, else gloo), `"gloo"` or `"nccl"`. `timeout`: each cell's default
    timeout in seconds (None: none). `engines`: the ipyparallel launcher (`"local"`, `"mpi"`,
    `"slurm"`, `"ssh"`, ...). `host`: the address the control plane listens on (loopback by
    default; name an interface for ranks on other machines). `check`: the checked-collective
    runtime. `progress`: show start-up progress. `register_timeout`: seconds the engines get
    to register (a launcher that fails says so at once; a batch queue may need longer).

    Ranks on other machines, over ssh: `hosts` (`{"node1": 4, "node2": 4}` or
    `"node1:4,node2:4"`; `n` is their sum), `host` this machine's address on the network they
    share, `python` the interpreter on the hosts (default: this one's path, as on a shared
    home), `ssh_args` for ssh and scp (`["-i", "~/.ssh/cluster"]`).

    Ranks through Slurm: `engines="slurm"`, `host` as above, and `slurm` the options of the
    command that starts them, as on a command line (`"--partition gpu --time 1:00:00 --account
    proj"`): srun's inside an allocation (`salloc`, an `sbatch` script), where `n` defaults to
    its tasks, and elsewhere sbatch's, which submits a job of `n` tasks.

    Raises `ConfigError` for options that cannot work here, `SessionError` (nothing left
    running) if the cluster cannot start.

    >>> with distnb.start(2) as s:
    ...     s.run("print(rank, world_size)")
    [rank 0] 0 2
    [rank 1] 1 2
    """
    kind = engine_kind(
        engines,
        n=n,
        backend=backend,
        host=host,
        hosts=hosts,
        python=python,
        ssh_args=ssh_args,
        slurm=slurm,
    )
    options = Options(
        n=kind.ranks(n, backend),
        engines=kind,
        backend=backend,
        timeout=timeout,
        host=host,
        check=check,
        progress=progress,
        register_timeout=register_timeout,
    )
    return Session(options).start()


# Users meet them as `distnb.Session` and `distnb.start`.
Session.__module__ = start.__module__ = "distnb"
