"""Ranks through Slurm on two rehearsal nodes, as a user of a cluster starts them: a job of their
own from a login node (`distnb.start(engines="slurm", slurm="--time 5 ...")`), or a step of the
allocation the kernel runs in (`salloc`); what sbatch refuses, a job that fails or waits in the
queue, a rank killed on a node and a killed kernel."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import distnb
from distnb.errors import CollectiveMismatchError, DistnbWarning, SessionError
from distnb.session import Session
from harness.hosts import Lan, missing
from harness.slurm import Slurm
from harness.slurm import missing as slurm_missing
from tests.multihost.conftest import engines_on, forked_on
from tests.multihost.test_ssh_faults import gone_within, lose_rank_1

pytestmark = [
    pytest.mark.multihost,
    pytest.mark.skipif(bool(missing()), reason=f"rehearsal hosts need {missing()}"),
    pytest.mark.skipif(bool(slurm_missing()), reason=f"rehearsal Slurm needs {slurm_missing()}"),
]

FAILED_S = 15  # a job that ends is named within a few of squeue's polls, not the 120 s timeout


@pytest.fixture(scope="module")
def slurm(lan: Lan) -> Iterator[Slurm]:
    """Slurm on h2 and h3; the kernel's IPython folder where the nodes see it (a shared home)."""
    cluster = Slurm(lan, lan.hosts)
    with pytest.MonkeyPatch.context() as env:
        for name, value in {**cluster.env, "IPYTHONDIR": str(cluster.shared / "ipython")}.items():
            env.setenv(name, value)
        try:
            yield cluster
        finally:
            cluster.close()


def start(lan: Lan, n: int = 2, **options: object) -> Session:
    options = {"slurm": "--ntasks-per-node 1", **options}
    return distnb.start(n, engines="slurm", host=lan.kernel_addr, progress=False, **options)  # type: ignore[arg-type]


def live_jobs(slurm: Slurm) -> list[str]:
    """Jobs queued or running (not those Slurm is still clearing up from a cut-off node)."""
    return [job for job in slurm.jobs() if not job.endswith(" COMPLETING")]


def no_jobs_within(slurm: Slurm, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while live_jobs(slurm) and time.monotonic() < deadline:
        time.sleep(0.2)
    return live_jobs(slurm) == []


def profiles(slurm: Slurm) -> list[Path]:
    return list((slurm.shared / "ipython" / "distnb").glob("distnb-profile-*"))


def test_a_job_of_its_own_runs_ranks_on_two_nodes_with_the_options_given(
    lan: Lan, slurm: Slurm
) -> None:
    s = start(lan, 4, slurm="--time 5 --ntasks-per-node 2 --job-name notebook-ranks")
    try:
        job, state, limit, name = slurm.command("squeue", "-h", "-o", "%i %T %l %j").stdout.split()
        assert (state, limit, name) == ("RUNNING", "5:00", "notebook-ranks")
        result = s.run(
            "import os, socket\nx = torch.full((2,), rank + 1.0)\ndist.all_reduce(x)\n"
            "(socket.gethostname(), os.environ['SLURM_JOB_ID'], x.tolist())",
        )
        # ranks in srun's order: its tasks 0-1 on the first node, 2-3 on the second
        assert [result.result(r) for r in range(4)] == [
            f"('{h}', '{job}', [10.0, 10.0])" for h in ("h2", "h2", "h3", "h3")
        ]
        assert [row[:3] for row in s.status().hosts()] == [
            ("h2", lan.hosts[0].addr, "ranks 0-1"),
            ("h3", lan.hosts[1].addr, "ranks 2-3"),
        ]
        with pytest.raises(CollectiveMismatchError, match=r"rank 3: all_reduce\(float32\[3\]"):
            s.run("x = torch.ones(3 if rank == 3 else 2)\ndist.all_reduce(x)")
    finally:
        started = time.monotonic()
        s.stop()
    assert time.monotonic() - started < 10
    assert no_jobs_within(slurm, 30) and engines_on(lan.hosts[0]) == engines_on(lan.hosts[1]) == 0
    assert profiles(slurm) == []


# Each rank: its node, its parent (pid, whether it loaded libtorch, its command line), the torch
# module it runs, and the Slurm task it took the place of.
FORKED = (
    "import os, socket, sys\n"
    "parent = f'/proc/{os.getppid()}'\n"
    "(socket.gethostname(), os.getppid(), 'libtorch' in open(f'{parent}/maps').read(), "
    "open(f'{parent}/cmdline').read().split('\\0')[1:4], id(sys.modules['torch']), "
    "os.environ['SLURM_PROCID'])"
)


@pytest.mark.parametrize(
    ("order", "on_nodes"), [("block", ((0, 1), (2, 3))), ("cyclic", ((0, 2), (1, 3)))]
)
def test_the_engines_of_a_node_are_forked_by_one_task_that_imported_torch(
    lan: Lan, slurm: Slurm, order: str, on_nodes: tuple[tuple[int, int], ...]
) -> None:
    """A job of 2 nodes of 2 tasks, in Slurm's block or cyclic order: on each node one forker
    (the node's first task), the parent of the node's engines, which inherit its torch; the
    node's other task holds its place; rank r is Slurm's task r, on task r's node. The stop ends
    them all."""
    s = start(lan, 4, slurm=f"--ntasks-per-node 2 --distribution {order}")
    try:
        seen = [ast.literal_eval(s.run(FORKED).result(r)) for r in range(4)]
        assert [task for *_, task in seen] == ["0", "1", "2", "3"]
        for host, ranks in zip(lan.hosts, on_nodes, strict=True):
            forkers = forked_on(host)
            (forker, engines), *others = [(f, e) for f, e in forkers.items() if e]
            assert not others and sorted(engines) == sorted(s.ranks[r].pid for r in ranks)
            assert len([f for f, e in forkers.items() if not e]) == 1  # the other task, holding
            names, parents, loaded, commands, modules, _ = zip(*(seen[r] for r in ranks))
            assert set(names) == {host.name} and set(parents) == {forker}
            assert all(loaded) and len(set(modules)) == 1  # one torch, the forker's
            assert commands[0][:2] == ["-m", "distnb.rank.slurm_tasks"]
            assert not [p for p in host.processes() if "distnb.rank.engine" in p]
    finally:
        s.stop()
    assert no_jobs_within(slurm, 30)
    assert not [p for h in lan.hosts for p in h.processes() if "distnb.rank" in p]


ALLOCATED = """
import json, os, sys
import distnb
s = distnb.start(engines="slurm", host=sys.argv[1], progress=False)
r = s.run("import os, socket\\n(socket.gethostname(), os.environ['SLURM_JOB_ID'], "
          "os.environ['SLURM_STEP_ID'])")
print(json.dumps([os.environ["SLURM_JOB_ID"], [r.result(i) for i in range(len(s.ranks))]]))
s.stop()
"""


def test_inside_an_allocation_the_ranks_are_a_step_of_it(lan: Lan, slurm: Slurm) -> None:
    salloc = ["salloc", "--quiet", "-n", "2", "--ntasks-per-node", "1"]
    done = slurm.command(*salloc, sys.executable, "-c", ALLOCATED, lan.kernel_addr, timeout=120)
    assert done.returncode == 0, done.stderr
    job, ranks = json.loads(done.stdout.splitlines()[-1])
    assert sorted(ranks) == [f"('{h}', '{job}', '0')" for h in ("h2", "h3")]  # n: the allocation's
    assert no_jobs_within(slurm, 30)


FORKED_STEP = f"""
import json, sys
import distnb
s = distnb.start(engines="slurm", host=sys.argv[1], progress=False)
print(json.dumps([s.run({FORKED!r}).result(r) for r in range(len(s.ranks))]))
s.stop()
"""


def test_inside_an_allocation_each_node_forks_its_ranks(lan: Lan, slurm: Slurm) -> None:
    """The step of an allocation of 2 nodes of 2 tasks: each node's ranks are children of one
    forker that loaded torch; rank r is task r of the step."""
    salloc = ["salloc", "--quiet", "-n", "4", "--ntasks-per-node", "2"]
    done = slurm.command(*salloc, sys.executable, "-c", FORKED_STEP, lan.kernel_addr, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = [ast.literal_eval(r) for r in json.loads(done.stdout.splitlines()[-1])]
    assert [(name, task) for name, *_, task in seen] == [
        ("h2", "0"),
        ("h2", "1"),
        ("h3", "2"),
        ("h3", "3"),
    ]
    for ranks in ((0, 1), (2, 3)):
        _, parents, loaded, commands, modules, _ = zip(*(seen[r] for r in ranks))
        assert len(set(parents)) == 1 and all(loaded) and len(set(modules)) == 1
        assert commands[0][:2] == ["-m", "distnb.rank.slurm_tasks"]
    assert no_jobs_within(slurm, 30)
    assert not [p for h in lan.hosts for p in h.processes() if "distnb.rank" in p]


def test_what_sbatch_refuses_is_said_at_once(lan: Lan, slurm: Slurm) -> None:
    started = time.monotonic()
    with pytest.raises(SessionError, match="sbatch: error: invalid partition specified: gpu"):
        start(lan, slurm="--partition gpu")
    assert time.monotonic() - started < FAILED_S
    assert live_jobs(slurm) == [] and profiles(slurm) == []


def test_a_job_that_fails_is_named_with_its_output(lan: Lan, slurm: Slurm) -> None:
    started = time.monotonic()
    failed = r"Slurm job \d+ (failed|ended) before every engine"
    with pytest.raises(SessionError, match=failed) as info:
        start(lan, python="/opt/none/bin/python")
    assert time.monotonic() - started < FAILED_S
    assert "/opt/none/bin/python" in str(info.value)  # srun's word for it, from the job's output
    assert no_jobs_within(slurm, 30)


def test_a_job_that_waits_in_the_queue_says_why_and_is_cancelled(lan: Lan, slurm: Slurm) -> None:
    with pytest.raises(SessionError, match=r"Slurm job \d+ is pending \(BeginTime\)"):
        start(lan, slurm="--begin now+1hour", register_timeout=4)
    assert live_jobs(slurm) == []


@pytest.mark.parametrize("fault", ["killed", "cut off"])
def test_a_rank_lost_on_a_node_is_named_with_its_node(lan: Lan, slurm: Slurm, fault: str) -> None:
    s = start(lan)
    victim = s.ranks[1]
    node = next(h for h in lan.hosts if h.name == victim.host)
    assert node is not lan.hosts[0]  # not slurmctld's host: srun puts task 1 on the second node
    try:
        lose_rank_1(s, node, fault)
    finally:
        s.stop()
        node.link(up=True)
    # a cut-off node's rank ends once its controller's heartbeat stops
    assert gone_within(node, 60) and no_jobs_within(slurm, 30)
    slurm.resume(node)


KERNEL = """
import sys, time
import distnb
s = distnb.start(2, engines="slurm", host=sys.argv[1], slurm="--ntasks-per-node 1", progress=False)
print("started", flush=True)
time.sleep(600)
"""


def test_a_killed_kernel_leaves_no_job_and_nothing_on_the_nodes(lan: Lan, slurm: Slurm) -> None:
    kernel = subprocess.Popen(
        [sys.executable, "-c", KERNEL, lan.kernel_addr], stdout=subprocess.PIPE, text=True
    )
    try:
        assert kernel.stdout is not None and kernel.stdout.readline() == "started\n"
        assert len(live_jobs(slurm)) == 1
    finally:
        kernel.kill()
        kernel.wait()
    # the reaper ends the controller; the engines end once its heartbeat stops; then the job
    assert all(gone_within(h, 60) for h in lan.hosts)
    assert no_jobs_within(slurm, 30) and profiles(slurm) == []


def test_a_stop_with_the_slurm_controller_cut_off_is_bounded_and_says_so(
    lan: Lan, slurm: Slurm
) -> None:
    head = lan.hosts[0]  # slurmctld's host, and a node
    s = start(lan)
    head.link(up=False)
    try:
        started = time.monotonic()
        with pytest.warns(DistnbWarning, match=r"Slurm job \d+ was not cancelled: scancel"):
            s.stop()
        assert time.monotonic() - started < 20  # scancel's 10 s, not minutes
    finally:
        head.link(up=True)
    # its engines end by themselves once the controller's heartbeat stops, and the job with
    # them (Slurm's own bookkeeping of the cut-off node takes longer: "completing")
    assert all(gone_within(h, 60) for h in lan.hosts)
    assert live_jobs(slurm) == []
    slurm.resume(head)
