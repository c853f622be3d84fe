"""What a stop did: the ranks it ended, host by host, and those on hosts it could not reach.

`Cluster.stop` says which hosts did not answer (`silent`) and which of this machine's processes
it ended; `teardown_report` puts the session's ranks on their hosts, so that `%dist_stop` and
`Session.stop()` say exactly what was stopped and what was not reached, instead of counting
every rank as stopped. Ranks on a host that was not reached end by themselves within
`LIFELINE_BOUND_S` of losing the kernel (`distnb.rank.lifeline`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from distnb.rank.lifeline import BOUND_S as LIFELINE_BOUND_S
from distnb.ranklist import format_ranks
from distnb.records.cell import RankInfo

__all__ = ["LIFELINE_BOUND_S", "HostTeardown", "TeardownReport", "teardown_report"]


@dataclass(frozen=True, slots=True)
class HostTeardown:
    """The ranks of one host, and whether the stop reached it."""

    host: str  # as the ranks name it, and as its launcher was given it where that differs
    ranks: tuple[int, ...]
    reached: bool


@dataclass(frozen=True, slots=True)
class TeardownReport:
    """What `Session.stop()` ended (`str()` is what `%dist_stop` prints)."""

    hosts: tuple[HostTeardown, ...]
    processes: int  # processes of this machine ended: the controller, engines, nannies, ...
    left: tuple[int, ...] = ()  # pids of this machine still alive after the stop
    interrupted: bool = False  # Ctrl-C came while it stopped: it finished first

    @property
    def stopped(self) -> tuple[int, ...]:
        return tuple(r for h in self.hosts if h.reached for r in h.ranks)

    @property
    def not_reached(self) -> tuple[int, ...]:
        return tuple(r for h in self.hosts if not h.reached for r in h.ranks)

    def __str__(self) -> str:
        reached = [h for h in self.hosts if h.reached and h.ranks]
        if len(reached) == 1:
            where = f" on {reached[0].host}"
        else:
            where = f" ({'; '.join(_ranks_on(h) for h in reached)})" if reached else ""
        processes = f"{self.processes} process{'es' * (self.processes != 1)} on this machine"
        lines = [f"stopped {format_ranks(self.stopped)}{where} and the controller ({processes})"]
        for host in self.hosts:
            if not host.reached:
                lines.append(
                    f"not reached: {_ranks_on(host)}, which did not answer the stop: they end "
                    f"by themselves within {LIFELINE_BOUND_S:.0f} s of losing the kernel"
                )
        if self.left:
            lines.append(f"still running here: pids {', '.join(map(str, self.left))}")
        if self.interrupted:
            lines.append(
                "Ctrl-C came while the cluster stopped: the stop finished first (a stop cut "
                "half-way would leave processes running)"
            )
        return "\n".join(lines)


def teardown_report(
    ranks: Sequence[RankInfo], silent: Sequence[str], processes: int, left: Sequence[int] = ()
) -> TeardownReport:
    """Each host's ranks (in rank order), reached unless its launcher's name for it is in
    `silent` (the hosts that did not answer, as the engine kind names them)."""
    by_host: dict[str, list[int]] = {}
    names: dict[str, str] = {}
    for info in sorted(ranks, key=lambda r: r.rank):
        key = info.launched_on or info.host
        by_host.setdefault(key, []).append(info.rank)
        names[key] = key if key == info.host else f"{info.host} ({key})"
    hosts = [HostTeardown(names[h], tuple(rs), h not in silent) for h, rs in by_host.items()]
    hosts += [HostTeardown(h, (), False) for h in silent if h not in by_host]
    return TeardownReport(tuple(hosts), processes, tuple(left))


def _ranks_on(host: HostTeardown) -> str:
    return f"{format_ranks(host.ranks)} on {host.host}" if host.ranks else host.host
