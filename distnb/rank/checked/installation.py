"""The checked runtime of this process: `install` and `uninstall` it, switch checks off or up
inside a block (`unchecked`, `finite_checks`), start a run, and read what it recorded
(`events`).

There is one installation per process, held here (`_checker`, with the interceptor and the
patches it put in place): every entry point of the package reads it from this module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from torch._C._distributed_c10d import Store

from distnb.rank.checked import callsite
from distnb.rank.checked.checker import Checker
from distnb.rank.checked.context import Patches
from distnb.rank.checked.intercept import Interceptor
from distnb.rank.checked.p2p import P2P
from distnb.records.collective import CollectiveEvent

__all__ = [
    "begin_run",
    "clear",
    "events",
    "finite_checks",
    "forget_groups",
    "install",
    "installed",
    "unchecked",
    "uninstall",
]

_checker: Checker | None = None
_interceptor = Interceptor()
_patches: Patches | None = None
# installs per session: part of the shared-memory names, so that a re-install never meets the
# files of the one before (every rank of a session installs and uninstalls together)
_generations: dict[str, int] = {}


def install(
    store: Store,
    *,
    rank: int,
    world_size: int,
    session_id: str,
    hosts: Sequence[str] | None = None,
    check_finite: bool = False,
    ring_size: int = 10_000,
) -> None:
    """Check every collective of this process from now on; call on every rank alike.

    `store` is this session's control-plane store (a `PrefixStore` of the kernel's TCPStore);
    `session_id` names this cluster's shared-memory files: use a new one when rank processes
    are restarted, and install/uninstall on every rank together. `hosts[r]` is rank r's host: ranks
    on one host exchange fingerprints through shared memory; None finds out through the store
    (at each group's first collective). `check_finite` also refuses reductions of NaN/Inf
    (see `finite_checks`). `ring_size` bounds the recorded events (see `events`).
    Installing again replaces the previous installation.
    """
    global _checker, _patches
    if _checker is not None:
        uninstall()
    generation = _generations[session_id] = _generations.get(session_id, 0) + 1
    checker = Checker(
        store,
        rank=rank,
        world_size=world_size,
        session_id=session_id,
        hosts=hosts,
        check_finite=check_finite,
        ring_size=ring_size,
        generation=generation,
    )
    p2p = P2P(checker)
    _patches = Patches(send=p2p.send, recv=p2p.recv, batch=p2p.batch, interceptor=_interceptor)
    _checker = checker
    _interceptor.install(checker.collective, p2p.op)


def uninstall() -> None:
    """Put torch's own kernels and functions back and remove this rank's shared-memory boards."""
    global _checker, _patches
    _interceptor.uninstall()
    if _patches is not None:
        _patches.restore()
        _patches = None
    if _checker is not None:
        _checker.close()
        _checker = None


def installed() -> bool:
    return _checker is not None


def forget_groups() -> None:
    """The process groups were destroyed (`destroy_process_group`): forget them, their seqs
    and boards, so that groups made next (the same names come back) start in step. Call on
    every rank alike, as torch's own teardown is."""
    if _checker is not None:
        _checker.forget_groups()


@contextmanager
def unchecked() -> Iterator[None]:
    """Run collectives unchecked inside the block (on every rank alike), e.g. a hot loop::

    with distnb.unchecked():
        for _ in range(1000):
            dist.all_reduce(x)

    The block covers collectives made from other threads meanwhile (DDP's reducer on CUDA).
    """
    _interceptor.paused += 1
    try:
        yield
    finally:
        _interceptor.paused -= 1


@contextmanager
def refused(error: Exception) -> Iterator[None]:
    """Every collective raises `error` inside the block, before any data moves: code run where
    its peers are not (a rank's imports made ahead while it waits, `distnb.rank.ahead`)."""
    _interceptor.refusal = error
    try:
        yield
    finally:
        _interceptor.refusal = None


@contextmanager
def finite_checks(enabled: bool = True) -> Iterator[None]:
    """Inside the block, reductions also refuse NaN/Inf inputs.

    all_reduce, reduce and reduce_scatter* then run `torch.isfinite(x).all()` on each floating
    input (one pass over the data and one host sync per tensor) and, if any rank's input is not
    finite, every rank raises `CollectiveMismatchError` of kind "non-finite input" naming the
    ranks, before anything is reduced.
    """
    checker = _checker
    if checker is None:
        yield
        return
    before = checker.check_finite
    checker.check_finite = enabled
    try:
        yield
    finally:
        checker.check_finite = before


def begin_run(run_id: int, filename_to_cell: Callable[[str], int | None] | None = None) -> None:
    """Start of a run (a cell, a script): events and beacons name `run_id`, and waits watch
    `keys.abort(run_id)`.

    `filename_to_cell` maps the file name IPython compiled a cell to (`<ipython-input-3-..>`,
    `/tmp/ipykernel_1/123.py`) to its cell number, so call sites read "cell In[3] line 2".
    """
    callsite.set_cell_resolver(filename_to_cell)
    if _checker is not None:
        _checker.run_id = run_id


def events(since_run: int | None = None) -> list[CollectiveEvent]:
    """This rank's recorded collectives, oldest first (the last `ring_size` of them)."""
    return [] if _checker is None else _checker.recorder.events(since_run)


def clear() -> None:
    """Forget the recorded events."""
    if _checker is not None:
        _checker.recorder.clear()
