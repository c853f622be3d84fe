"""`%dist_status` on the kernel's side: ask every live rank what it runs with, name the dead.

A rank whose process is gone is not asked; its state says how it died, and the OOM killer is
named when the evidence says so (`distnb.session.cluster.oom`). A rank that does not answer within
`PROBE_TIMEOUT_S` (stopped, or blocked in native code holding the GIL) shows `no answer`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from distnb.records.cell import RankInfo
from distnb.records.resources import RankResources
from distnb.session.cluster.members import LEFT_CLUSTER
from distnb.session.cluster.oom import OOM_TEXT
from distnb.views.display import in_kernel
from distnb.views.status import ALIVE, Status

if TYPE_CHECKING:
    from distnb.session.surface import SessionSurface

__all__ = ["NO_CLUSTER", "PROBE_TIMEOUT_S", "prepare", "status"]

NO_CLUSTER = "distnb: no cluster running; start one with %dist_start"
PROBE_TIMEOUT_S = 3.0
NO_ANSWER = "no answer"


def status(session: SessionSurface) -> Status:
    """One row per rank: rank, host, pid, device, backend, memory (now and peak), torch's
    intra-op threads, CUDA memory where there is CUDA, and state; then the distributed
    environment of each rank.

    >>> s.status()
    rank  host  pid    device  backend  memory (peak)          intra-op threads  state
    0     vm    13901  cpu     gloo     402.1 MiB (402.3 MiB)  1                 alive
    1     vm    13903  cpu     gloo     401.7 MiB (402.0 MiB)  1                 alive
    environment:
      OMP_NUM_THREADS=1  ranks 0-1
    """
    if session.cluster is None:
        return Status((), NO_CLUSTER)
    states = [_state(session, info) for info in session.ranks]
    alive = [info for info, state in zip(session.ranks, states) if state == ALIVE]
    # A broken cluster (its controller gone) would leave the probe waiting for its timeout:
    # its living ranks are shown alive, without figures.
    found = _probe(session, alive) if not session.broken else None
    if found is not None:
        states = [
            NO_ANSWER if s == ALIVE and r.rank not in found else s
            for r, s in zip(session.ranks, states)
        ]
    found = found or {}
    notes = [session.broken] if session.broken else []
    notes += [
        f"rank {info.rank} (pid {info.pid}) {OOM_TEXT}: give it less to hold (a smaller batch or "
        "model, fewer ranks per host), then run %dist_restart."
        for info, state in zip(session.ranks, states)
        if state == OOM_TEXT
    ]
    return Status(
        session.ranks,
        "\n".join(notes),
        tuple(found.get(info.rank) for info in session.ranks),
        tuple(states),
    )


def prepare(session: SessionSurface) -> None:
    """Right after the ranks start: count OOM kills so far; outside Jupyter, make the ranks'
    widgets (tqdm.auto bars, ipywidgets) text, since nothing here can show them."""
    from distnb.rank import textmode

    assert session.cluster is not None
    session.cluster.members.count_ooms(r.pid for r in session.ranks if r.here)
    if not in_kernel():
        session.call(textmode.use_text_frontend)


def _state(session: SessionSurface, info: RankInfo) -> str:
    """`alive`, or how a local rank's process died; a rank on another host is alive while its
    engine is in the cluster (the controller drops it when its nanny or heartbeat says so)."""
    cluster = session.cluster
    assert cluster is not None
    if not info.here:
        client = cluster.client
        return ALIVE if client is not None and info.engine_id in client.ids else LEFT_CLUSTER
    if cluster.members.running(info.pid):
        return ALIVE
    return cluster.members.how_died(info.pid, wait=0.2)


def _probe(session: SessionSurface, ranks: list[RankInfo]) -> dict[int, RankResources]:
    """Each rank's resources, asked of all at once; ranks that do not answer are left out."""
    from distnb.rank import resources

    cluster = session.cluster
    assert cluster is not None
    pending: list[tuple[int, Any]] = [
        (info.rank, cluster.view(info.engine_id).apply_async(resources.probe, info.rank))
        for info in ranks
    ]
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    found = {}
    for rank, ar in pending:
        try:
            found[rank] = ar.get(timeout=max(0.0, deadline - time.monotonic()))
        except Exception:  # a dead engine, a timeout: the row says "no answer"
            continue
    cluster.forget(ar for _, ar in pending)
    return found
