"""Attaching to real torchrun jobs (torch's own launcher, gloo on CPU) that hang, mismatch,
go NaN, or run on: the verdicts, stops, code in stopped frames, detach, and a stranger."""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch.distributed as dist

import distnb
from distnb.contract import keys
from distnb.judgement.mismatch import UNCHECKED
from distnb.records.agent import Stop, dumps_request
from distnb.records.attach import AgentState
from distnb.session.attach import AttachedJob, attach_processes, procs
from harness.jobs import (
    ANSWER_S,
    CHECKPOINT,
    GRADS,
    LEFT_THE_LOOP,
    METRICS,
    SKIPPED,
    TRAIN,
    job,
    judged,
)

pytestmark = pytest.mark.gloo


def settled(
    j: AttachedJob, want: dict[int, AgentState], until: Callable[[list], bool] = lambda s: True
) -> list:
    """The ranks' snapshots once every rank in `want` is in its state and `until` holds."""
    deadline = time.monotonic() + 120
    while True:
        snaps = j.snapshots()
        if all(snaps[r].state is s for r, s in want.items()) and until(snaps):
            return snaps
        assert time.monotonic() < deadline, [(s.rank, s.state, s.where) for s in snaps]
        time.sleep(0.2)


def attached(folder: Path) -> AttachedJob:
    deadline = time.monotonic() + 120
    while not (folder / "endpoint.json").exists():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    return distnb.attach(str(folder), timeout=120)


def hung(snaps: list) -> bool:
    """Rank 0 in its last all_reduce, rank 1 in the "checkpoint" it never finishes."""
    call = snaps[0].current
    return call is not None and call.seq == 15 and snaps[1].stack[-1].line == CHECKPOINT


def test_a_rank_that_skipped_a_collective_is_named_with_both_lines(tmp_path: Path) -> None:
    with job(tmp_path, "hang", STEPS="8", SKIP_AT="3") as jb:
        j = attached(jb.folder)
        jb.wait_for(r"final 1 ")  # rank 1 has left the loop
        snaps = settled(j, {0: AgentState.COLLECTIVE, 1: AgentState.RUNNING}, hung)
        assert snaps[0].step == 7 and snaps[1].step == 8
        judged(j, lambda v: LEFT_THE_LOOP in v and SKIPPED in v)
        train = str(TRAIN)
        text = repr(j.status())
        assert "in all_reduce #15 on WORLD" in text and "rank 1:" in text
        if procs.pyspy() is not None:  # the same job read without the agent: stacks only
            run = next(
                env["TORCHELASTIC_RUN_ID"] for pid, env in procs.find_ranks() if pid == snaps[0].pid
            )
            view = attach_processes(run)
            assert f"rank 0 sits in all_reduce at {train}:{METRICS}" in view.verdicts
            assert f"rank 1 runs outside any collective, at {train}:{CHECKPOINT} in main" in (
                view.verdicts
            )
            assert "need the agent" in view.note
        j.detach()


def test_a_rank_blocked_outside_any_collective_is_stopped_where_it_is(tmp_path: Path) -> None:
    """Rank 1 sleeps in its "checkpoint", where no collective will ever come: `at="now"` stops
    it there (a signal its agent handles on the main thread), code runs in its frame, and
    detaching lets it go on sleeping as it would have."""
    with job(tmp_path, "hang", STEPS="8", SKIP_AT="3") as jb:
        j = attached(jb.folder)
        jb.wait_for(r"final 1 ")  # rank 1 has left the loop
        settled(j, {0: AgentState.COLLECTIVE, 1: AgentState.RUNNING}, hung)
        j.stop([1], at="now")
        snaps = settled(j, {1: AgentState.STOPPED})
        assert snaps[1].where == f"{TRAIN}:{CHECKPOINT}", snaps[1].where
        assert j.run("print(MODE, rank, step)") == {1: "hang 1 7\n"}
        j.detach()
        again = attached(jb.folder)
        snaps = settled(again, {1: AgentState.RUNNING})
        assert snaps[1].stack[-1].line == CHECKPOINT  # back in its sleep
        again.detach()


def test_a_shape_mismatch_gloo_let_through_is_named(tmp_path: Path) -> None:
    with job(tmp_path, "mismatch", STEPS="4", SKIP_AT="2", LINGER="1") as jb:
        jb.wait_for(r"final 1 ")
        j = attached(jb.folder)
        verdicts = judged(j, lambda v: any(x.startswith("shape mismatch") for x in v))
        found = [v for v in verdicts if v.startswith("shape mismatch")]
        assert found[0].startswith("shape mismatch in broadcast #6 on WORLD")
        assert "rank 0: broadcast(float32[4], src=0)" in found[0]
        assert "rank 1: broadcast(float32[8], src=0)" in found[0]
        # the job's checks are off: gloo ran both calls, nothing held them
        assert found[0].endswith(UNCHECKED) and "Nothing was sent" not in found[0]
        # rank 1 waits in a barrier it made its #6: the mismatch is said once, not as a hang
        assert not any("every member has entered" in v for v in verdicts), verdicts
        j.detach()


def test_stopped_and_resumed_the_job_ends_bit_for_bit_as_never_attached(tmp_path: Path) -> None:
    ready = tmp_path / "READY"
    ready.touch()
    with job(tmp_path, "wait", STEPS="6", READY=str(ready), agent=False) as plain:
        expected = plain.finals()
    ready.unlink()
    with job(tmp_path, "wait", STEPS="6", READY=str(ready)) as jb:
        j = attached(jb.folder)
        with pytest.raises(distnb.errors.ConfigError, match="no rank 5"):
            j.stop([5])
        with pytest.raises(distnb.errors.ConfigError, match=r"rank 0 refused break: .*nothere"):
            j.breakpoint("nothere.py:3")
        j.stop()
        ready.touch()
        settled(j, {0: AgentState.STOPPED, 1: AgentState.STOPPED})
        out = j.run("(step, flat.shape)")
        assert out == {0: "(0, torch.Size([9]))\n", 1: "(0, torch.Size([9]))\n"}
        j.detach()
        assert jb.finals() == expected and len(expected) == 2


def test_stopped_and_held_ranks_write_nothing_to_the_jobs_output(tmp_path: Path) -> None:
    ready = tmp_path / "READY"
    with job(tmp_path, "wait", STEPS="4", READY=str(ready)) as jb:
        j = attached(jb.folder)
        j.stop([0])  # rank 0 stops in the debugger, rank 1 is held before its next collective
        ready.touch()
        snaps = settled(j, {0: AgentState.STOPPED, 1: AgentState.HELD})
        # a stopped rank's stack is the job's (to the collective it stopped before), without
        # the debugger's machinery it sits in
        files = [f.file for f in snaps[0].stack]
        assert str(TRAIN) in files and files[-1].endswith("distributed_c10d.py"), files
        assert not [f for f in files if f.endswith(("/pdb.py", "/bdb.py", "/cmd.py"))], files
        before = len(jb.log.read_text())
        time.sleep(2.0)  # a while of being stopped and held: what it writes, if anything
        written = jb.log.read_text()[before:]
        assert "waitForInput" not in written and "likely a timeout" not in written, written
        j.detach()
        assert set(jb.finals()) == {0, 1}


def test_a_nan_rank_is_found_from_the_stopped_frames(tmp_path: Path) -> None:
    ready = tmp_path / "READY"
    with job(tmp_path, "nan", STEPS="6", SKIP_AT="2", READY=str(ready), LINGER="1") as jb:
        j = attached(jb.folder)
        j.breakpoint(f"{TRAIN.name}:{GRADS}", cond="step == 2")
        ready.touch()  # the breakpoint is set at each rank's first collective
        snaps = settled(j, {0: AgentState.STOPPED, 1: AgentState.STOPPED})
        assert [s.where for s in snaps] == [f"{TRAIN}:{GRADS}"] * 2
        out = j.run("bool(flat.isfinite().all())")
        assert out == {0: "True\n", 1: "False\n"}
        j.detach()
        jb.wait_for(r"final 1 ")  # resumed: the job reaches its end


def test_a_stranger_on_the_port_is_never_believed(tmp_path: Path) -> None:
    ready = tmp_path / "READY"
    with job(tmp_path, "wait", STEPS="4", READY=str(ready)) as jb:
        j = attached(jb.folder)
        e = j.link.endpoint
        stranger = dist.TCPStore(e.host, e.port, is_master=False,
                                 timeout=datetime.timedelta(seconds=5))  # fmt: skip
        for rank in (0, 1):
            n = stranger.add(f"{e.run}/{keys.agent_calls(rank)}", 1) - 1
            stranger.set(f"{e.run}/{keys.agent_request(rank, n)}", dumps_request(Stop()))
        stranger.set(f"{e.run}/{keys.AGENT_LEASE}", "999")
        snaps = j.snapshots(ANSWER_S)  # the notebook's own requests replace the forged ones
        assert [s.state for s in snaps] == [AgentState.RUNNING] * 2
        j.detach()
        ready.touch()
        assert set(jb.finals()) == {0, 1}


def test_a_job_that_ends_while_attached_is_said_once_and_the_next_one_attaches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from IPython.core.error import UsageError

    from tests.attach.test_inside import magics_on

    ready = tmp_path / "READY"
    with job(tmp_path, "ok", STEPS="4", READY=str(ready)) as first:
        ip = magics_on(attached(first.folder))
        ready.touch()
        first.finals()  # the job ran to its end while attached
        # the next look says so in one line, and the notebook lets go of the job
        ended = r"^job ok-0 has ended \(exit status 0\): every rank finished its script; "
        with pytest.raises(UsageError, match=ended):
            ip.run_cell_magic("attached", "", "print(step)")
        with pytest.raises(UsageError, match=r"no job is attached"):
            ip.run_cell_magic("attached", "", "print(step)")
    second_ready = tmp_path / "READY2"
    with job(tmp_path, "ok", STEPS="4", READY=str(second_ready)) as second:
        attached(second.folder).detach()  # its agents are up
        capsys.readouterr()
        view = ip.run_line_magic("dist_attach", str(second.folder))
        assert repr(view).startswith("job ok-1 (2 ranks"), repr(view)
        second_ready.touch()
        second.finals()
        # the Python API: the ended job's status is a view that says so, detach is quiet
        j = ip.magics_manager.registry["AttachMagics"].job
        assert "ended" in repr(j.status()).splitlines()[0]
        assert j.gone
        ip.run_line_magic("dist_attach", "")  # said, then let go: nothing attached
        assert ip.magics_manager.registry["AttachMagics"].job is None


def test_a_job_that_ends_because_a_rank_ran_out_of_data_is_said_in_one_line(
    tmp_path: Path,
) -> None:
    """Rank 1's data runs out: its script ends while rank 0 waits in its next all_reduce, which
    gloo then fails ("Connection closed by peer"), and the job ends. Each rank's agent left its
    last snapshot in the run folder: the ending is said with both ranks' lines."""
    with job(tmp_path, "uneven", STEPS="8", SKIP_AT="3") as jb:
        j = attached(jb.folder)
        status = jb.proc.wait(timeout=120)
        assert status != 0
        view = j.status()  # the control plane is gone: this finds it so
        said = j.ended_words()
    train = str(TRAIN)
    assert said.startswith(f"job {jb.folder.name} has ended (exit status {status}): "), said
    assert (
        f"rank 0 raised in all_reduce #6 on WORLD at {train}:{GRADS}: RuntimeError: "
        "Connection closed by peer"
    ) in said, said
    assert (
        f"rank 1 had finished its script without calling it (last: all_reduce #5 on WORLD at "
        f"{train}:{METRICS})"
    ) in said, said
    assert said.endswith("; %dist_attach attaches to the next run (distnb.attach())"), said
    assert view.verdicts and view.verdicts[0] in said, view.verdicts
