"""distnb: debug distributed PyTorch interactively, from Jupyter or IPython.

    %load_ext distnb
    %dist_start -n 2
    %%allranks
    x = torch.ones(3) * rank
    dist.all_reduce(x)
    print(rank, x)

Importing distnb is cheap: torch, ipyparallel and ipywidgets load when a session starts.
"""

from __future__ import annotations

import typing as _typing

if _typing.TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from IPython.core.interactiveshell import InteractiveShell

    from distnb.records.replicas import ReplicaReport
    from distnb.session import Session

__all__ = [
    "Session",
    "check_finite",
    "diff_replicas",
    "load_ipython_extension",
    "start",
    "unchecked",
]
__version__ = "0.1.0"


def start(
    n: int | None = None,
    *,
    backend: str = "auto",
    timeout: float | None = None,
    engines: str = "local",
    host: str = "127.0.0.1",
    check: bool = True,
    progress: bool = True,
    register_timeout: float = 120.0,  # distnb.session.options.REGISTER_TIMEOUT_S
    hosts: str | _typing.Mapping[str, int] | None = None,
    python: str = "",
    ssh_args: _typing.Sequence[str] = (),
    slurm: str | _typing.Sequence[str] = (),
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

    >>> with distnb.start(2) as s:
    ...     s.run("print(rank, world_size)")
    [rank 0] 0 2
    [rank 1] 1 2
    """
    from distnb.session import start as _start

    return _start(
        n,
        backend=backend,
        timeout=timeout,
        engines=engines,
        host=host,
        check=check,
        progress=progress,
        register_timeout=register_timeout,
        hosts=hosts,
        python=python,
        ssh_args=ssh_args,
        slurm=slurm,
    )


def unchecked() -> AbstractContextManager[None]:
    """On a rank: run the enclosed collectives without distnb's checks (every rank alike).

    >>> with distnb.unchecked():
    ...     for _ in range(1000):
    ...         dist.all_reduce(x)
    """
    from distnb.rank.checked import unchecked as _unchecked

    return _unchecked()


def check_finite(enabled: bool = True) -> AbstractContextManager[None]:
    """On a rank: inside the block, reductions refuse NaN/Inf inputs and name the rank(s) whose
    input held them (one `isfinite` pass and host sync per tensor).

    >>> with distnb.check_finite():
    ...     dist.all_reduce(grad)   # CollectiveMismatchError: non-finite input on rank 1 ...
    """
    from distnb.rank.checked import finite_checks

    return finite_checks(enabled)


def diff_replicas(
    *targets: str | _typing.Mapping[str, _typing.Any],
    grads: bool = False,
    buffers: bool = False,
    atol: float = 0.0,
    expect: str = "same",
    ranks: _typing.Sequence[int] | None = None,
) -> ReplicaReport:
    """On every rank alike (a script under `%dist_run`, an `%%allranks` cell): do replicas hold
    the same bits? `targets` are names in the rank's namespace or `{name: object}`; the report
    is `%dist_diff`'s, the same on every rank. Digests travel through distnb's control plane,
    not your process group.

    >>> report = distnb.diff_replicas({"model": model, "opt": opt}, grads=True)
    >>> report.agree
    False
    >>> [(d.name, d.agree, d.max_abs) for d in report.differences]
    [('model.fc.weight', ((0,), (1,)), 0.25)]
    """
    from distnb.rank.replicas.check import diff_replicas as _diff

    return _diff(*targets, grads=grads, buffers=buffers, atol=atol, expect=expect, ranks=ranks)


def load_ipython_extension(ipython: InteractiveShell) -> None:
    """`%load_ext distnb`: register the magics (loading twice is harmless)."""
    from distnb.magics import DistMagics

    if not any(isinstance(m, DistMagics) for m in ipython.magics_manager.registry.values()):
        from distnb.session import visual
        from distnb.session.postmortem import route_debugger

        magics = DistMagics(ipython)
        ipython.register_magics(magics)
        route_debugger(ipython, lambda: magics.session)  # %debug and %pdb on reach a failed rank
        visual.install(ipython)  # JupyterLab's debugger reaches the ranks of %%allranks cells


def unload_ipython_extension(ipython: InteractiveShell) -> None:
    """`%unload_ext distnb`: stop the running session."""
    from distnb.magics import DistMagics

    for magics in ipython.magics_manager.registry.values():
        if isinstance(magics, DistMagics):
            from distnb.session import visual
            from distnb.session.postmortem import unroute_debugger

            unroute_debugger(ipython)
            visual.uninstall()
            if magics.session is not None:
                magics.session.stop()


def __getattr__(name: str) -> object:
    if name == "Session":
        from distnb.session import Session

        return Session
    raise AttributeError(f"module 'distnb' has no attribute {name!r}")


def __dir__() -> list[str]:
    return [*__all__, "__version__", "unload_ipython_extension"]
