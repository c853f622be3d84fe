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
    return len([p for p in host.processes() if "distnb.rank.engine" in p])
