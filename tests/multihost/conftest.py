"""Fixtures of the multihost tests: one rehearsal network of two hosts for the whole run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import distnb
from distnb.session import Session
from harness.hosts import Host, Lan


@pytest.fixture(scope="session")
def lan(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lan]:
    network = Lan(tmp_path_factory.mktemp("lan"))
    try:
        network.add_host("h2")
        network.add_host("h3")
        yield network
    finally:
        network.close()


def start_on(lan: Lan, hosts: dict[str, int]) -> Session:
    return distnb.start(hosts=hosts, host=lan.kernel_addr, ssh_args=lan.ssh_args, progress=False)


def engines_on(host: Host) -> int:
    """The engines running on `host`: forked by its forker (`distnb.rank.forks`, whose engines
    keep its command line), or started alone."""
    forked = forked_on(host)
    alone = [p for p in host.processes() if "distnb.rank.engine" in p]
    return sum(len(engines) for engines in forked.values()) + len(alone)


def forked_on(host: Host) -> dict[int, list[int]]:
    """Each forker running on `host` (a `distnb.rank.forks` process, or a Slurm task's
    `distnb.rank.slurm_tasks`, whose parent is not one) and the pids of the engines it forked;
    srun's own processes, whose command line names the program, left out."""
    rows = host.ssh("ps -eo pid=,ppid=,args=").stdout.splitlines()
    forks = {
        int(pid): int(ppid)
        for pid, ppid, args in (row.split(None, 2) for row in rows if row.count(" ") >= 2)
        if ("distnb.rank.forks" in args or "distnb.rank.slurm_tasks" in args)
        and not args.startswith("srun ")
    }
    forkers = {pid for pid, ppid in forks.items() if ppid not in forks}
    return {f: [pid for pid, ppid in forks.items() if ppid == f] for f in forkers}
