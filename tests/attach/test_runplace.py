"""Which launcher of a job on several nodes hosts its control plane, and what the others join
(`distnb.runplace`): torchrun's own argument parser, this machine's addresses, real folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from distnb.contract.folders import Endpoint, RunFolder
from distnb.errors import ConfigError
from distnb.runplace import Place, join, owns, place

TWO = ["--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "1"]
ELSEWHERE = "198.51.100.7"  # TEST-NET-2: never an address of this machine


def test_one_node_hosts_its_own_control_plane_on_loopback() -> None:
    where = place("r1", "", ["--standalone", "--nproc-per-node", "2", "train.py"])
    assert where == Place("r1", "127.0.0.1", True)


def test_the_rendezvous_host_is_the_control_planes_and_only_its_node_hosts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    args = [*TWO, "--rdzv-id", "job7", "--master-addr", ELSEWHERE, "train.py"]
    assert place("", "", args) == Place("job7", ELSEWHERE, False)
    monkeypatch.setenv("SLURM_JOB_ID", "42")  # every node of a Slurm job: one run
    assert place("", "", args).run == "slurm-42"


def test_several_nodes_need_one_run_name_and_an_address_every_node_reaches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(ConfigError, match=r"--distnb-run NAME \(the same on each node\)"):
        place("", ELSEWHERE, [*TWO, "train.py"])
    with pytest.raises(ConfigError, match=r"not 127\.0\.0\.1: give --distnb-host ADDR"):
        place("r1", "", [*TWO, "--rdzv-endpoint", "localhost:29400", "train.py"])


def test_a_node_owns_its_addresses_only() -> None:
    assert owns("127.0.0.1") and not owns(ELSEWHERE)


def test_a_joining_node_that_cannot_see_the_run_folder_says_how_to_share_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISTNB_RUNS", str(tmp_path))
    with pytest.raises(ConfigError, match=r"after 0.3 s: the node with address .* \(scp -rp\)"):
        join(Place("r1", ELSEWHERE, False), wait_s=0.3)


def test_a_joining_node_refuses_the_folder_of_another_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISTNB_RUNS", str(tmp_path))
    folder = RunFolder.create("r1")
    folder.write_secret()
    folder.write_endpoint(Endpoint("r1", "198.51.100.9", 5, "old", 1, 0.0))
    with pytest.raises(ConfigError, match=r"another run \(control plane at 198.51.100.9"):
        join(Place("r1", ELSEWHERE, False), wait_s=1)
    folder.write_endpoint(Endpoint("r1", ELSEWHERE, 5, "node0", 1, 0.0))
    assert join(Place("r1", ELSEWHERE, False), wait_s=1).path == folder.path
    folder.mark_ended(0)
    with pytest.raises(ConfigError, match="ended"):
        join(Place("r1", ELSEWHERE, False), wait_s=1)
