"""A torchrun job under the rehearsal Slurm cluster, attached by its Slurm job id.

A batch job of two nodes runs `srun python -m distnb.run --nnodes 2 --node-rank $SLURM_NODEID
...` as a user's batch file does (the rendezvous on the first node's address, which the batch
script, running there, reads from its own interface). The nodes and the notebook's machine see
one run folder, as a cluster's shared home does (`DISTNB_RUNS` on the rehearsal's shared
folder); the run is `slurm-<job id>` on every node, so `distnb.attach("<job id>")` finds it.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import distnb
from distnb.records.attach import AgentState
from harness import host_jobs as jobs
from harness.hosts import Lan, missing
from harness.jobs import LEFT_THE_LOOP, START_S, judged
from harness.slurm import Slurm
from harness.slurm import missing as slurm_missing
from tests.multihost.test_attach_hosts import settle

pytestmark = [
    pytest.mark.multihost,
    pytest.mark.gloo,
    pytest.mark.skipif(bool(missing()), reason=f"rehearsal hosts need {missing()}"),
    pytest.mark.skipif(bool(slurm_missing()), reason=f"rehearsal Slurm needs {slurm_missing()}"),
]


@pytest.fixture
def slurm(lan: Lan) -> Iterator[Slurm]:
    cluster = Slurm(lan, lan.hosts)
    try:
        yield cluster
    finally:
        cluster.close()


def batch(lan: Lan, runs: Path, mark: str) -> str:
    """The batch file: the first node's address, then one launcher per node through srun
    (`node.sh`: what each node runs, its node rank from Slurm)."""
    (runs / "node.sh").write_text(jobs.command(lan, "$SLURM_NODEID", "$HEAD", mark) + "\n")
    head = f"$(ip -o route get {lan.kernel_addr} | sed -n 's/.* src \\([^ ]*\\).*/\\1/p')"
    return (
        "#!/bin/bash\n"
        f"#SBATCH --nodes 2 --ntasks-per-node 1 --output {runs}/job-%j.log\n"
        f"export DISTNB_RUNS={runs}\n"
        f"export HEAD={head}  # the batch script runs on the first node: its address\n"
        f"srun bash {runs}/node.sh\n"
    )


def test_a_job_under_slurm_is_attached_by_its_job_id(
    lan: Lan, slurm: Slurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs, mark = slurm.shared / "runs", uuid.uuid4().hex
    runs.mkdir(mode=0o700)
    script = runs / "train.sbatch"
    script.write_text(batch(lan, runs, mark))
    submitted = slurm.command("sbatch", "--parsable", str(script))
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    try:
        monkeypatch.setenv("DISTNB_RUNS", str(runs))
        log = runs / f"job-{job_id}.log"
        deadline = time.monotonic() + START_S
        while not (log.exists() and re.search(r"final 1 ", log.read_text(errors="replace"))):
            said = log.read_text(errors="replace") if log.exists() else ""
            assert time.monotonic() < deadline and "exit code" not in said, said or slurm.jobs()
            time.sleep(0.2)
        with distnb.attach(job_id, timeout=START_S) as job:
            snaps = settle(job)
            assert [(s.host, s.state) for s in snaps] == [
                (lan.hosts[0].name, AgentState.COLLECTIVE),
                (lan.hosts[1].name, AgentState.RUNNING),
            ]
            judged(job, lambda v: LEFT_THE_LOOP in v)
            assert f"job slurm-{job_id} (2 ranks" in repr(job.status())
    finally:
        slurm.command("scancel", job_id)
        jobs.end(lan, mark, [])
        deadline = time.monotonic() + 30
        while jobs.left(lan, mark) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert jobs.left(lan, mark) == []
