"""The agent's recorder: every collective the rank enters, without checking it.

`Tape.record` is the `check` the checked runtime's interceptor calls for each collective op
(`distnb.rank.checked.intercept`: every path to a process group ends there, DDP's buckets and
functional collectives included). It does not exchange anything with the peers: it numbers the
call on its group (seq, as the checked runtime counts it), notes its call site, origin and
fingerprint core, keeps the call open until its work completes, and hands it to the backend.
The ring (`distnb.rank.checked.recorder`) holds the last `ring_size` calls.

The cost per collective is a describe, a stack walk for the call site and a list: no store
round trip, no lock. A call's end is the next call's arrival on its group, or the moment the
notebook notices its work has completed; while the rank is profiled (`exact`) it is the moment
its work completes (a callback on the work's future), which the profile's phases need. The
notebook pulls what it wants (`serve`). `gate`, when the notebook asks
for it, runs on the main thread before the call goes to the backend: a safe point to stop in
the debugger or to hold the rank while a peer is stopped (no peer waits inside the backend).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from distnb.rank.checked import callsite
from distnb.rank.checked.calls import Call
from distnb.rank.checked.groups import group_label
from distnb.rank.checked.recorder import ARRIVE, END, START, Recorder

__all__ = ["CORE", "GROUP_NAME", "MEMBERS", "Tape"]

# entry layout: the checked recorder's (`distnb.rank.checked.recorder`), then the fingerprint's
# core and the group's registered name
CORE, GROUP_NAME = 12, 13
# a group's list: [label, members (global ranks), calls entered so far]
LABEL, MEMBERS, ENTERED = range(3)
_MAIN = threading.main_thread()
_PENDING = object()  # an open call not yet handed to the backend (or still in its hands)


class Tape:
    """One rank's record of its collectives (see the module)."""

    def __init__(self, rank: int, ring_size: int = 10_000) -> None:
        self.rank = rank
        self.recorder = Recorder(ring_size)
        # registered name -> [label, members, calls entered]; None: this rank is not a member
        self.groups: dict[str, list[Any] | None] = {}
        # registered name -> (entry, its work; None: it returned none; _PENDING: not back yet)
        self.open: dict[str, tuple[list[Any], Any]] = {}
        self.gate: Callable[[list[Any]], None] | None = None
        self.exact = False  # each call's end noted as its work completes (see the module)

    def record(self, call: Call, dispatch: Callable[[], Any]) -> Any:
        """Note `call`, pass the gate if one is set, then run it (the interceptor's `check`)."""
        __tracebackhide__ = True
        arrive = time.monotonic_ns()
        name = call.group
        g = self.groups[name] if name in self.groups else self._group(name)
        if g is None:
            return dispatch()
        members = g[MEMBERS]
        site, origin = callsite.lookup()
        root = members[call.root] if call.root is not None else None
        peer = members[call.peer] if call.peer is not None else None
        seq = g[ENTERED]
        g[ENTERED] = seq + 1
        core = call.core(None, root, peer)
        entry = [
            self.rank,
            g[LABEL],
            seq,
            call.op,
            call.nbytes,
            site,
            arrive,
            arrive,
            0,
            None,
            len(members),
            origin,
            core,
            name,
        ]
        before = self.open.get(name)
        if before is not None and before[0][END] == 0:
            before[0][END] = arrive  # a group's calls end in order: the one before has ended
        self.open[name] = (entry, _PENDING)
        gate = self.gate
        if gate is not None and threading.current_thread() is _MAIN:
            gate(entry)
            entry[START] = time.monotonic_ns()
        self.recorder.add(entry)
        result = dispatch()
        work = _work(result)
        self.open[name] = (entry, work)
        if self.exact:
            _note_end(entry, work)
        return result

    def _group(self, name: str) -> list[Any] | None:
        pg = c10d._resolve_process_group(name)  # type: ignore[arg-type]
        g = None
        if pg is not None and not c10d._rank_not_in_group(pg):
            members = tuple(dist.get_process_group_ranks(pg))
            if self.rank in members:
                g = [group_label(pg, members), members, 0]  # LABEL, MEMBERS, ENTERED
        self.groups[name] = g
        return g

    def current(self) -> tuple[list[Any], float] | None:
        """The oldest call entered and not finished (its entry, seconds since), if any.

        Asked from the serving thread: a work's `is_completed` is safe to ask from any thread.
        A call that returned no work (a functional collective's tensors) counts as finished.
        """
        now = time.monotonic_ns()
        found = None
        for entry, work in list(self.open.values()):
            done = work is not _PENDING and (work is None or _completed(work))
            if done:
                if entry[END] == 0:
                    entry[END] = now  # noticed here; the exact end is not needed
            elif found is None or entry[ARRIVE] < found[ARRIVE]:
                found = entry
        return None if found is None else (found, (now - found[ARRIVE]) / 1e9)

    def calls(self) -> dict[str, int]:
        """Per group (registered name), the collectives entered so far."""
        return {name: g[ENTERED] for name, g in self.groups.items() if g is not None}


def _work(result: Any) -> Any:
    work = result[-1] if isinstance(result, tuple) else result
    if type(work) is torch.ScriptObject:
        return dist.Work.unbox(work)
    return work if isinstance(work, dist.Work) else None


def _note_end(entry: list[Any], work: Any) -> None:
    """`entry`'s end, as its work completes (now, for a call that returned none or has
    completed: a synchronous one)."""

    def ended(_: Any = None) -> None:
        entry[END] = time.monotonic_ns()

    if work is None or _completed(work):
        return ended()
    with contextlib.suppress(RuntimeError):  # a backend whose works have no future: later
        work.get_future().add_done_callback(ended)


def _completed(work: Any) -> bool:
    try:
        return bool(work.is_completed())
    except RuntimeError:  # an aborted work: it is not waited for any more
        return True
