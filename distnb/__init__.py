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
    from distnb.session import Session, start
    from distnb.session.attach import AttachedJob

__all__ = [
    "Session",
    "attach",
    "check_finite",
    "diff_replicas",
    "load_ipython_extension",
    "start",
    "unchecked",
]
__version__ = "0.1.0"


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


def attach(target: str | None = None, *, timeout: float = 10.0) -> AttachedJob:
    """Attach to a running job of `python -m distnb.run [torchrun's options] train.py`.

    `target`: its run folder, run id, Slurm job id or `host:port` (None: the newest run).
    What `%dist_attach` shows and does, as methods: `status()`, `verdicts()`, `timeline()`,
    `stop(ranks, at=)`, `breakpoint("train.py:52", cond)`, `debug()`, `run(code)`, `detach()`.

    >>> job = distnb.attach()
    >>> job.status()     # per rank: state, collective, step; who waits for whom; stacks
    >>> job.detach()
    """
    from distnb.session.attach import attach as _attach

    return _attach(target, timeout=timeout)


def load_ipython_extension(ipython: InteractiveShell) -> None:
    """`%load_ext distnb`: register the magics (loading twice is harmless)."""
    from distnb.magics import register

    register(ipython)


def unload_ipython_extension(ipython: InteractiveShell) -> None:
    """`%unload_ext distnb`: stop the running session."""
    from distnb.magics import unregister

    unregister(ipython)


def __getattr__(name: str) -> object:
    # `Session` and `start` live with the session, which imports what a session needs: they
    # load when first used, so that `import distnb` stays cheap.
    if name in ("Session", "start"):
        from distnb import session

        return getattr(session, name)
    raise AttributeError(f"module 'distnb' has no attribute {name!r}")


def __dir__() -> list[str]:
    return [*__all__, "__version__", "unload_ipython_extension"]
