"""Attaching without the agent (`%dist_attach --no-agent`, `attach_processes`): the torchrun
jobs of this machine listed, the hung one picked among several, a job named by its launcher's
pid, and a rank's collective told from its native stack (DDP's gradient all_reduce runs in C++,
under backward, where no Python frame of `torch.distributed` shows it)."""

from __future__ import annotations

import re
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from distnb.errors import ConfigError
from distnb.records.attach import AgentState, RankSnapshot, StackFrame
from distnb.session.attach import attach_processes, procs
from distnb.session.attach.stacks import Sample, Wait, waited
from harness.jobs import Job, job, line_of

DDP = Path(__file__).parents[2] / "harness" / "ddp_train.py"
BACKWARD, CHECKPOINT = (
    line_of("# the gradients' all_reduce", DDP),
    line_of('# "saving a checkpoint"', DDP),
)
SITE = StackFrame(str(DDP), BACKWARD, "main")
TORCH = "/venv/lib/python3.11/site-packages/torch"
# rank 0 of a hung DDP job as py-spy 0.4 dumps it (`--native`): the reducer waits for its
# buckets at the end of backward, on the main thread (the native frames distnb keeps)
REDUCER = (
    StackFrame(str(DDP), 47, "<module>"),
    SITE,
    StackFrame(f"{TORCH}/_tensor.py", 623, "Tensor.backward"),
    StackFrame(f"{TORCH}/autograd/__init__.py", 395, "backward"),
    StackFrame(f"{TORCH}/autograd/graph.py", 979, "_engine_run_backward"),
    StackFrame(f"{TORCH}/lib/libtorch_cpu.so", 0, "c10d::Reducer::finalize_backward"),
)


def test_ddps_gradient_all_reduce_is_told_from_the_reducers_native_frame() -> None:
    wait = waited(REDUCER)
    assert wait == Wait("all_reduce", "DDP gradient bucket in backward", SITE)
    assert waited(REDUCER[:-1]) is None  # Python frames only: a backward, no collective


def test_a_python_collective_and_a_bare_work_wait_are_told_apart() -> None:
    c10d = StackFrame(f"{TORCH}/distributed/distributed_c10d.py", 3151, "broadcast")
    work = StackFrame(f"{TORCH}/lib/libtorch_cpu.so", 0, "c10d::Work::wait")
    user = StackFrame("probe.py", 8, "<module>")
    assert waited((user, c10d, work)) == Wait("broadcast", "", user)
    assert waited((user, work)) == Wait("Work.wait", "an async collective's work", user)
    store = StackFrame(f"{TORCH}/lib/libtorch_cpu.so", 0, "c10d::TCPStore::wait")
    assert waited((user, store)) is None  # a store's wait is no collective


def test_a_job_looks_hung_only_when_no_rank_moved_and_one_waits() -> None:
    main = (("MainThread", REDUCER),)
    waiting = Sample(REDUCER, waited(REDUCER), main)
    sleeping = Sample(REDUCER[:2], None, (("MainThread", REDUCER[:2]),))
    assert procs.looks_hung([waiting, sleeping], [waiting, sleeping])
    assert not procs.looks_hung([sleeping, sleeping], [sleeping, sleeping])  # nobody waits
    assert not procs.looks_hung([sleeping, sleeping], [waiting, sleeping])  # rank 0 moved
    assert not procs.looks_hung([Sample(), waiting], [Sample(), waiting])  # rank 0 not read
    # a running job's rank caught at the same line twice (its loop sleeps at each step) has
    # computed in between; a rank in a collective may spin where it waits: its CPU says nothing
    stepped = replace(sleeping, cpu_s=0.5)
    assert not procs.looks_hung([waiting, sleeping], [waiting, stepped])
    assert procs.looks_hung([waiting, sleeping], [replace(waiting, cpu_s=0.5), sleeping])


def attach_magic(line: str) -> object:
    """`%dist_attach LINE` in a real IPython shell."""
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython() or get_ipython()
    ip.run_line_magic("load_ext", "distnb")
    return ip.run_line_magic("dist_attach", line)


def children(pid: int) -> set[int]:
    return {p.pid for p in psutil.Process(pid).children()}


def stepped(log: Path, rank: int, step: int) -> bool:
    return re.search(rf"step {rank} {step}\b", log.read_text()) is not None


def mine(*launched: Job) -> list[procs.TorchrunJob]:
    """This test's jobs as `find_jobs` lists them: the machine is shared, other jobs may run."""
    pids = {j.proc.pid for j in launched}
    return [j for j in procs.find_jobs() if pids & set(j.launchers)]


@pytest.mark.gloo
@pytest.mark.skipif(procs.pyspy() is None, reason="needs py-spy")
def test_of_two_jobs_the_hung_ddp_one_is_picked_and_its_wait_named(tmp_path: Path) -> None:
    """A DDP job whose rank 1 left the loop (rank 0 waits in the next backward's gradient
    all_reduce) beside a job that trains on: of the two, the hung one is picked, with why, the
    other listed; its ranks' state and collective are filled; either is named by its launcher's
    pid or its run id."""
    with (
        job(tmp_path, "ok", agent=False, script=DDP) as healthy,
        job(tmp_path, "hang", agent=False, script=DDP, SKIP_AT="3") as hung,
    ):
        hung.wait_for(r"step 1 3(?!\d)")  # rank 1 has left the loop
        healthy.wait_for(r"step 1 3(?!\d)")
        time.sleep(2)  # rank 0 reaches the next backward's all_reduce
        t0 = time.monotonic()
        both = mine(healthy, hung)
        snaps, why = procs.look(jobs=both)
        picked_s = time.monotonic() - t0
        assert {s.pid for s in snaps} == children(hung.proc.pid), why
        assert f"launcher pid {hung.proc.pid}, run" in why  # why this one
        assert "looks hung: rank 0 waited in a collective and no rank moved in 1 s" in why
        assert f"launcher pid {healthy.proc.pid}, " in why.split("The others")[1]
        print(f"2 jobs listed and the hung one picked in {picked_s:.1f} s")

        view = attach_magic(f"--no-agent {hung.proc.pid}")
        assert {s.pid for s in view.snapshots} == children(hung.proc.pid), view
        r0, r1 = view.snapshots
        assert r0.state is AgentState.COLLECTIVE and r1.state is AgentState.RUNNING, view
        assert r0.current is not None and r0.current.op == "all_reduce"
        assert "in all_reduce (DDP gradient bucket in backward)" in repr(view)  # the column
        assert view.verdicts == (
            f"rank 0 sits in all_reduce (DDP gradient bucket in backward) at {DDP}:{BACKWARD}",
            f"rank 1 runs outside any collective, at {DDP}:{CHECKPOINT} in main",
        )
        assert view.note == procs.NEEDS_AGENT  # named: nothing was chosen
        if len(procs.find_jobs()) == 2:  # no other job on the machine: as a user types it
            assert f"launcher pid {hung.proc.pid}, " in attach_magic("--no-agent").note

        other = attach_processes(str(healthy.proc.pid))
        assert {s.pid for s in other.snapshots} == children(healthy.proc.pid)
        assert all(s.state is not AgentState.UNKNOWN for s in other.snapshots), other
        run = next(j.run for j in both if healthy.proc.pid in j.launchers)
        assert attach_processes(run).snapshots[0].pid in children(healthy.proc.pid)


@pytest.mark.gloo
@pytest.mark.skipif(procs.pyspy() is None, reason="needs py-spy")
def test_two_jobs_that_both_run_are_listed_with_how_to_name_one(tmp_path: Path) -> None:
    with (
        job(tmp_path, "ok", agent=False, script=DDP) as first,
        job(tmp_path, "ok", agent=False, script=DDP) as second,
    ):
        first.wait_for(r"step 1 2(?!\d)")
        second.wait_for(r"step 1 2(?!\d)")
        with pytest.raises(ConfigError) as found:
            procs.look(jobs=mine(first, second))
        said = str(found.value)
        assert said.startswith("2 torchrun jobs run on this machine and none of them look hung")
        for launched in (first, second):
            assert f"launcher pid {launched.proc.pid}, " in said
        assert re.search(r"ranks \(pid\) 0: \d+, 1: \d+: \S*python", said), said
        assert "%dist_attach --no-agent PID" in said
        with pytest.raises(ConfigError, match=r"no torchrun job here has .* '12345678'"):
            attach_processes("12345678")


def test_a_snapshot_read_from_a_stack_says_so_in_the_view() -> None:
    """No seq, group or age without the agent: the column says the op and where it came from."""
    from distnb.views.attach import row

    wait = waited(REDUCER)
    assert wait is not None
    snap = procs._snapshot(0, "h", 1, 2, 0, Sample(REDUCER, wait, (("MainThread", REDUCER),)))
    assert isinstance(snap, RankSnapshot) and snap.state is AgentState.COLLECTIVE
    assert row(snap)[5] == "in all_reduce (DDP gradient bucket in backward)"
