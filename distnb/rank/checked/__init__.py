"""Checked collectives: ranks compare what they are about to do before any data moves.

`install()` checks every collective and point-to-point op that reaches a process group, whoever
calls it: `torch.distributed`'s functions, DDP's constructor and its reducer (C++, on autograd
threads), FSDP2, DTensor and tensor parallel, pipelining, and `torch.compile`d graphs. It does so
beneath all of them, at the ops every path ends in (`intercept`). Before data moves, the members
of the group exchange **fingerprints** (op, tensor shapes, dtypes and device types, reduce op,
root, peer, split sizes, object-list length, a DDP model's parameters, call site and origin) for
the group's next **seq**, and `distnb.judgement` judges them. When they do not fit, every member
raises the same `CollectiveMismatchError` (the record is on `err.mismatch`) and nothing is sent,
so gloo never aborts and the process group keeps working::

    checked.install(PrefixStore(session_id, client), rank=r, world_size=n, session_id=sid)
    dist.all_reduce(x)            # x: float32[8] on rank 0, float32[4] on rank 1
    # CollectiveMismatchError: shape mismatch in all_reduce #0 on WORLD: the tensors differ ...
    #   rank 0: all_reduce(float32[8], op=SUM)  at cell In[3] line 2: dist.all_reduce(x)
    #   rank 1: all_reduce(float32[4], op=SUM)  at cell In[3] line 2: dist.all_reduce(x)

The modules, in the order a call meets them: `intercept` (the kernels) and `methods` (a process
group's methods), `ops` and `funcol` (what each op is about to do), `calls` (a call, described),
`context` (what the Python-level caller adds: object collectives, DDP models, batches),
`callsite`, `graphs`, `origin` and `frameworks` (where the call was made, in a compiled graph
too, and what made it: torch's code or a framework's function), `checker`
(seq, the exchange and the verdict), `groups` (the groups and channels met, and their boards),
`p2p` (messages), `exchange` and `futex` (how fingerprints travel: shared memory on one host, the
control-plane store across hosts), `monitor` (long waits: beacons, the kernel's abort key,
deadlocks), `wire` (the fingerprint's bytes), `recorder` (events for the timeline). `installation`
holds this process's runtime (`install`, `uninstall` and the rest of the functions here). The
store keys are in `distnb.contract.keys`.

Limits: every rank of a group must run checked (or `unchecked()`) calls alike; the check adds a
synchronisation point before each collective (a rank cannot start collective n + 1 before its
peers have reached n). Not checked: receives from any source, sparse all_reduce, and ops on
devices other than CPU and CUDA.
"""

from __future__ import annotations

from distnb.rank.checked.installation import (
    begin_run,
    clear,
    events,
    finite_checks,
    forget_groups,
    install,
    installed,
    refused,
    unchecked,
    uninstall,
)

__all__ = [
    "begin_run",
    "clear",
    "events",
    "finite_checks",
    "forget_groups",
    "install",
    "installed",
    "refused",
    "unchecked",
    "uninstall",
]
