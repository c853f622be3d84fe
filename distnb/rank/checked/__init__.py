"""Checked collectives: ranks compare what they are about to do before any data moves.

`install()` replaces every public collective and point-to-point function of `torch.distributed`
(and of `torch.distributed.distributed_c10d`, which other libraries call) with a checked wrapper.
Before data moves, the members of the group exchange **fingerprints** (op, tensor shapes, dtypes
and device types, reduce op, root, peer, split sizes, object-list length, call site) for the
group's next **seq**, and `distnb.matching` judges them. When they do not fit, every member
raises the same `CollectiveMismatchError` (the record is on `err.mismatch`) and nothing is sent,
so gloo never aborts and the process group keeps working::

    checked.install(PrefixStore(session_id, client), rank=r, world_size=n, session_id=sid)
    dist.all_reduce(x)            # x: float32[8] on rank 0, float32[4] on rank 1
    # CollectiveMismatchError: shape mismatch in all_reduce #0 on WORLD: the tensors differ ...
    #   rank 0: all_reduce(float32[8], op=SUM)  at cell In[3] line 2: dist.all_reduce(x)
    #   rank 1: all_reduce(float32[4], op=SUM)  at cell In[3] line 2: dist.all_reduce(x)

Fingerprints travel through shared memory when a group's ranks share a host (microseconds; a
futex wakes the waiting rank), through the control-plane store otherwise (`exchange`). A rank
that waits longer than 5 ms writes its **beacon**, watches the kernel's abort key, and looks at
its peers' beacons (`monitor`): ranks that wait for each other in different calls (another
group's collective, two receives) all raise a "group"/"peer"/"op type" mismatch instead of
hanging. Ctrl-C interrupts a wait. The store keys it uses are in `distnb.keys`.

Covered: all_reduce, reduce, broadcast, all_gather, all_gather_into_tensor, all_gather_single,
gather, scatter, reduce_scatter, reduce_scatter_tensor, reduce_scatter_single, all_to_all,
all_to_all_single, barrier, monitored_barrier, the object collectives, send, recv, isend, irecv,
batch_isend_irecv (names the installed torch lacks are skipped), sub-groups from `new_group`
(one seq per group; only members check) and `async_op=True` (checked before dispatch; the real
`Work` is returned). DDP's gradient buckets bypass Python: `check_ddp(model)` registers
`checked_allreduce_hook`. Calls torch makes inside a checked call are not checked again.

Limits: every rank of a group must run checked (or `unchecked()`) calls alike; collectives of
one rank must come from one thread; a `P2POp` must be built from `dist.isend`/`dist.irecv` looked
up after `install` (torch checks op identity); see `p2p` for point-to-point limits.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket, Store
from torch.distributed import distributed_c10d as c10d

from distnb.rank.checked import callsite, ops, p2p
from distnb.rank.checked.checker import Checker, dispatch, local
from distnb.records.collective import CollectiveEvent, Mismatch

__all__ = [
    "begin_run",
    "check_ddp",
    "checked_allreduce_hook",
    "clear",
    "events",
    "finite_checks",
    "install",
    "installed",
    "last_mismatch",
    "unchecked",
    "uninstall",
]

_MODULES = (dist, c10d)
_checker: Checker | None = None
_originals: dict[tuple[Any, str], Any] = {}
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
    global _checker
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
    _patch()
    _checker = checker


def uninstall() -> None:
    """Put torch's own functions back and remove this rank's shared-memory boards."""
    global _checker
    for (module, name), original in _originals.items():
        setattr(module, name, original)
    _originals.clear()
    if _checker is not None:
        _checker.close()
        _checker = None


def installed() -> bool:
    return _checker is not None


@contextmanager
def unchecked() -> Iterator[None]:
    """Run collectives unchecked inside the block (on every rank alike), e.g. a hot loop::

    with distnb.unchecked():
        for _ in range(1000):
            dist.all_reduce(x)
    """
    local.depth += 1
    try:
        yield
    finally:
        local.depth -= 1


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


def checked_allreduce_hook(state: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: average a gradient bucket like DDP's default, through the checked
    `all_reduce` (so ranks whose buckets differ raise instead of hanging or aborting).

    `state` is the process group to use (None: the default group)::

        ddp.register_comm_hook(None, checked_allreduce_hook)   # or: check_ddp(ddp)
    """
    group = state if isinstance(state, dist.ProcessGroup) else None
    buffer = bucket.buffer()
    buffer.div_(dist.get_world_size(group))
    work = dist.all_reduce(buffer, group=group, async_op=True)
    assert work is not None
    fut: torch.futures.Future[list[torch.Tensor]] = work.get_future()
    return fut.then(lambda f: f.value()[0])


# DDP compares the hook's annotations with `dist.GradBucket` and `Future[Tensor]` themselves;
# `from __future__ import annotations` made them strings, so give it the objects.
checked_allreduce_hook.__annotations__.update(
    bucket=GradBucket, state=Any, **{"return": torch.futures.Future[torch.Tensor]}
)


def check_ddp(model: Any, process_group: Any = None) -> Any:
    """Register `checked_allreduce_hook` on a `DistributedDataParallel` model; returns it.

    Call it on every rank, instead of (not besides) another comm hook: DDP takes one hook.
    """
    model.register_comm_hook(process_group, checked_allreduce_hook)
    return model


# --- patching ---------------------------------------------------------------------------------


def _patch() -> None:
    wrappers: dict[str, Any] = {}
    for name, describe in ops.DESCRIBERS.items():
        original = getattr(c10d, name, None)
        if original is not None:
            wrappers[name] = _wrap(name, original, describe)
    original_batch = getattr(c10d, "batch_isend_irecv", None)
    if original_batch is not None:
        wrappers["batch_isend_irecv"] = _wrap_batch(original_batch)
    for module in _MODULES:
        for name, wrapper in wrappers.items():
            if hasattr(module, name):
                _originals[(module, name)] = getattr(module, name)
                setattr(module, name, wrapper)


def _wrap(name: str, original: Any, describe: Callable[..., ops.Call]) -> Any:
    is_p2p = name in ops.P2P_OPS

    @functools.wraps(original)
    def checked(*args: Any, **kwargs: Any) -> Any:
        checker = _checker
        if checker is None or local.depth:
            return original(*args, **kwargs)
        try:
            call = describe(*args, **kwargs)
        except ops.Unchecked:
            if name in ("recv", "irecv"):
                return p2p.recv_anysource(checker, original, args, kwargs, name)
            return dispatch(original, args, kwargs)
        except Exception:  # arguments torch will reject: let it say so
            return dispatch(original, args, kwargs)
        if is_p2p:
            return p2p.p2p(checker, original, call, args, kwargs)
        return checker.collective(original, call, args, kwargs)

    return checked


def _wrap_batch(original: Any) -> Any:
    @functools.wraps(original)
    def checked(p2p_op_list: Any) -> Any:
        checker = _checker
        if checker is None or local.depth:
            return original(p2p_op_list)
        return p2p.batch(checker, original, p2p_op_list)

    return checked
