"""Engines becoming ranks: ranks assigned, a backend chosen, the process group joined, and a
group whose ranks cannot reach each other named.

Ranks follow the launcher's order when every engine has a rank of its launcher (mpiexec,
srun), each its own, else they are grouped by host (`assign_ranks`, a pure function).

Each rank posts where it listens (host, interface, address: `keys.endpoint`) just before it
joins. Once every rank has posted, what is left is connecting: gloo's full mesh takes well
under a second on a working network, NCCL's communicator some seconds. A group still not joined
`CONNECT_S` (more from 16 ranks on: `connect_limit`) after the last rank arrived, and with no
rank joined since, cannot connect (a firewall, a route, an interface the
others cannot reach), and would otherwise wait out its timeout (10 minutes) in silence: the
start fails at once, naming each rank's host and address and the setting to change.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from distnb.contract import keys
from distnb.errors import ConfigError
from distnb.ranklist import format_ranks
from distnb.records.cell import EngineProbe, RankInfo, RankSpec
from distnb.session.control import ControlPlane, ask_for_forged
from distnb.session.options import Options

__all__ = [
    "CONNECT_S",
    "JOIN_TIMEOUT_S",
    "Placement",
    "assign_ranks",
    "choose_backend",
    "connect_limit",
    "join",
    "wait_joined",
]

CONNECT_S = {"gloo": 15.0, "nccl": 60.0}  # from the last rank's arrival at the group
JOIN_TIMEOUT_S = 120.0  # for the ranks to arrive at all (their start, on a busy machine)


@dataclass(frozen=True, slots=True)
class Placement:
    probe: EngineProbe
    rank: int
    local_rank: int
    local_world_size: int


def assign_ranks(probes: Sequence[EngineProbe]) -> list[Placement]:
    """Ranks 0..N-1: the launcher's order when every engine has a rank of its launcher (mpiexec,
    srun), each its own, else grouped by host.

    Grouping by host (hosts in order of their lowest engine id) makes `local_rank` the index
    of a rank on its host, which is the CUDA device it uses.
    """
    launched = {p.mpi_rank for p in probes}
    if None not in launched and len(launched) == len(probes):
        ordered = sorted(probes, key=lambda p: p.mpi_rank or 0)
    else:
        first_seen: dict[str, int] = {}
        for p in sorted(probes, key=lambda p: p.engine_id):
            first_seen.setdefault(p.host, len(first_seen))
        ordered = sorted(probes, key=lambda p: (first_seen[p.host], p.engine_id))
    per_host: dict[str, int] = {}
    counts = {p.host: sum(q.host == p.host for q in probes) for p in probes}
    placements = []
    for rank, p in enumerate(ordered):
        local = per_host.get(p.host, 0)
        per_host[p.host] = local + 1
        placements.append(Placement(p, rank, local, counts[p.host]))
    return placements


def choose_backend(requested: str, placements: Sequence[Placement]) -> str:
    """`auto` is NCCL when every rank has a CUDA device of its own, else gloo."""
    short = [p for p in placements if p.probe.cuda_devices < p.local_world_size]
    if requested == "gloo":
        return "gloo"
    if requested == "nccl":
        if short:
            p = short[0]
            raise ConfigError(
                f"--backend nccl needs one CUDA device per rank, but host {p.probe.host} runs "
                f"{p.local_world_size} ranks and has {p.probe.cuda_devices} CUDA device(s). "
                f"Use -n {p.probe.cuda_devices or 1} or --backend gloo."
            )
        return "nccl"
    return "gloo" if short or not placements else "nccl"


def join(
    cluster: Any,
    control: ControlPlane,
    client: Any,
    opts: Options,
    on_progress: Callable[[str, int], None],
) -> tuple[RankInfo, ...]:
    """Make the registered engines ranks: ask each where it runs, assign ranks (by host), and
    have every rank join the control plane and the process group."""
    from distnb.rank import runtime

    probes = [client[eid].apply_async(runtime.probe, eid) for eid in client.ids]
    placements = assign_ranks(cluster.wait_all(probes, timeout=60))
    control.expect_ranks(len(placements))
    backend = choose_backend(opts.backend, placements)
    pending = []
    for p in placements:
        spec = RankSpec(
            rank=p.rank,
            world_size=len(placements),
            local_rank=p.local_rank,
            local_world_size=p.local_world_size,
            backend=backend,
            store_host=opts.host,
            store_port=control.port,
            session_id=control.session_id,
            check=opts.check,
            secret=control.secret,
        )
        pending.append((p.rank, client[p.probe.engine_id].apply_async(runtime.init, spec)))
    infos = wait_joined(
        cluster,
        control.store,
        pending,
        backend,
        lambda joined: on_progress("ranks joined the process group", joined),
    )
    return tuple(
        replace(info, engine_id=p.probe.engine_id)
        for p, info in zip(placements, infos, strict=True)
    )


def wait_joined(
    cluster: Any,
    store: Any,
    pending: Sequence[tuple[int, Any]],
    backend: str,
    on_joined: Callable[[int], None],
) -> list[Any]:
    """Each `(rank, AsyncResult of its init)`'s result, in order. Fails as `cluster.wait_all`
    does (a process lost, `JOIN_TIMEOUT_S`), and when the group cannot connect (see above)."""
    results: dict[int, Any] = {}
    names = [keys.endpoint(rank) for rank, _ in pending]
    limit = connect_limit(backend, len(pending))
    started, arrived = time.monotonic(), 0.0
    while len(results) < len(pending):
        for rank, ar in pending:
            if rank not in results and ar.ready():
                (results[rank],) = cluster.wait_all([ar], timeout=0)
                on_joined(len(results))
                arrived = arrived and time.monotonic()  # a rank joined: the group connects
        if len(results) == len(pending):
            break
        cluster.raise_if_dead()
        now = time.monotonic()
        if not arrived and store.check(names):
            arrived = now
        elif not arrived:
            ask_for_forged(store)  # an endpoint a stranger overwrote: its rank posts it again
        if arrived and now - arrived > limit:
            raise RuntimeError(_cannot_connect(store, names, pending, results, backend, limit))
        if now - started > JOIN_TIMEOUT_S:
            raise TimeoutError(f"the engines did not answer within {JOIN_TIMEOUT_S:g} s")
        time.sleep(0.05)
    return [results[rank] for rank, _ in pending]


def connect_limit(backend: str, ranks: int) -> float:
    """How long after the last rank's arrival (or the last join since) a group that has not
    joined is taken for one that cannot connect: `CONNECT_S`, and as much again per 16 ranks
    beyond 16 (gloo's mesh is n(n-1)/2 connections; 32 ranks on 2 busy cores took longer than
    15 s to make them, while ranks that cannot reach each other never join at all)."""
    return CONNECT_S.get(backend, CONNECT_S["nccl"]) * max(1.0, ranks / 16)


def _cannot_connect(
    store: Any,
    names: list[str],
    pending: Sequence[tuple[int, Any]],
    joined: dict[int, Any],
    backend: str,
    limit: float,
) -> str:
    waiting = [rank for rank, _ in pending if rank not in joined]
    lines = [
        f"{format_ranks(waiting)} did not join the process group within "
        f"{limit:g} s of the last rank's arrival: the ranks cannot connect "
        "to each other."
    ]
    for (rank, _), raw in zip(pending, store.multi_get(names), strict=True):
        where = json.loads(raw) if raw else {}
        interface = f" (interface {where['ifname']})" if where.get("ifname") else ""
        state = "joined" if rank in joined else "waiting"
        lines.append(
            f"  rank {rank} on {where.get('host', '?')} listens on "
            f"{where.get('address') or '?'}{interface}: {state}"
        )
    var = "NCCL_SOCKET_IFNAME" if backend == "nccl" else "GLOO_SOCKET_IFNAME"
    lines.append(
        "Each host must reach the others' addresses (a firewall or a route may be in the way). "
        f"To use another network, set {var} in the kernel's environment before %dist_start "
        "(distnb passes it to the ranks), or start the control plane on that network (--host)."
    )
    return "\n".join(lines)
