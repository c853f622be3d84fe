"""Checked collectives: ranks compare what they are about to do before any data moves.

`install()` checks every collective and point-to-point op that reaches a process group, whoever
calls it: `torch.distributed`'s functions, DDP's constructor and its reducer (C++, on autograd
threads), FSDP2, DTensor and tensor parallel, pipelining, and `torch.compile`d graphs. It does so
beneath all of them, at the ops every path ends in (`intercept`). Before data moves, the members
of the group exchange **fingerprints** (op, tensor shapes, dtypes and device types, reduce op,
root, peer, split sizes, object-list length, a DDP model's parameters, call site and origin) for
the group's next **seq**, and `distnb.matching` judges them. When they do not fit, every member
raises the same `CollectiveMismatchError` (the record is on `err.mismatch`) and nothing is sent,
so gloo never aborts and the process group keeps working::

    checked.install(PrefixStore(session_id, client), rank=r, world_size=n, session_id=sid)
    dist.all_reduce(x)            # x: float32[8] on rank 0, float32[4] on rank 1
    # CollectiveMismatchError: shape mismatch in all_reduce #0 on WORLD: the tensors differ ...
    #   rank 0: all_reduce(float32[8], op=SUM)  at cell In[3] line 2: dist.all_reduce(x)
    #   rank 1: all_reduce(float32[4], op=SUM)  at cell In[3] line 2: dist.all_reduce(x)

The modules, in the order a call meets them: `intercept` (the kernels), `ops` and `funcol` (what
each op is about to do), `context` (what the Python-level caller adds: object collectives, DDP
models, batches), `callsite` and `origin` (where the call was made and what made it), `checker`
(seq, the exchange and the verdict), `groups` (the groups and channels met, and their boards),
`p2p` (messages), `exchange` and `futex` (how fingerprints travel: shared memory on one host, the
control-plane store across hosts), `monitor` (long waits: beacons, the kernel's abort key,
deadlocks), `wire` (the fingerprint's bytes), `recorder` (events for the timeline). The store
keys are in `distnb.keys`.

Limits: every rank of a group must run checked (or `unchecked()`) calls alike; the check adds a
synchronisation point before each collective (a rank cannot start collective n + 1 before its
peers have reached n). Not checked: receives from any source, sparse all_reduce, and ops on
devices other than CPU and CUDA.
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
from distnb.records.collective import CollectiveEvent, Mismatch

__all__ = [
    "begin_run",
    "clear",
    "events",
    "finite_checks",
    "forget_groups",
    "install",
    "installed",
    "last_mismatch",
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


def last_mismatch() -> Mismatch | None:
    """The mismatch this rank raised last, as a record (also on the error as `err.mismatch`)."""
    return None if _checker is None else _checker.last_mismatch
