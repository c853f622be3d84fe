"""Looking inside the stopped ranks of a real 4-rank torchrun job as inside distnb's own: the
shape table, replicas compared, the overflow tracer, through the Python API and through the
session's magics (acting on the attached job) on a real IPython shell; and ranks that wait in a
circle across groups named as such."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from distnb.magics import AttachMagics
from distnb.records.attach import AgentState
from distnb.session.attach import AttachedJob
from harness.jobs import GRADS, TRAIN, job, judged, line_of
from tests.attach.test_attach import attached, settled

pytestmark = pytest.mark.gloo

ALL = {r: AgentState.STOPPED for r in range(4)}


def test_shapes_and_replicas_of_four_stopped_ranks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ready = tmp_path / "READY"
    with job(tmp_path, "drift", n=4, STEPS="6", SKIP_AT="2", READY=str(ready)) as jb:
        j = attached(jb.folder)
        ip = magics_on(j)  # the condition quoted as the guide writes it: stops at step 3 only
        ip.run_line_magic("dist_attach", f'--break {TRAIN.name}:{GRADS} --if "step == 3"')
        assert f"a breakpoint at {TRAIN.name}:{GRADS} if step == 3 on ranks 0-3" in (
            capsys.readouterr().out
        )
        ready.touch()
        settled(j, ALL)
        table = repr(j.shapes(["x", "flat"]))
        assert "x" in table and "[4, 8]" in table and "flat" in table and "[9]" in table
        assert "ranks 0-3" in table
        drifted = j.diff("model")
        assert not drifted.agree
        assert {d.name: d.groups for d in drifted.report.differences} == {
            "model.weight": "0,2,3 | 1",
            "model.bias": "0,2,3 | 1",
        }
        assert j.diff("x", "flat", expect="differ").agree  # each rank's own batch and gradients
        with pytest.raises(Exception, match=r"rank 0, 1, 2, 3: NameError: .*no 'nothere'"):
            j.diff("nothere")
        # the session's magics act on the attached job: no second set of options
        capsys.readouterr()
        ip.run_line_magic("dist_shapes", "x flat")
        assert table in capsys.readouterr().out
        ip.run_line_magic("dist_diff", "model --ranks 0,2-3")
        shown = capsys.readouterr().out
        assert "agree" in shown and "ranks 0,2-3" in shown, shown
        with pytest.raises(UsageError, match=r"rank 0, 1, 2, 3: NameError: .*no 'nothere'"):
            ip.run_line_magic("dist_diff", "nothere")
        with pytest.raises(UsageError, match=r"--watch works on distnb's own ranks"):
            ip.run_line_magic("dist_diff", "model --watch")
        with pytest.raises(UsageError, match=r"%dist_attach --shapes is %dist_shapes"):
            ip.run_line_magic("dist_attach", "--shapes x")
        capsys.readouterr()
        ip.run_cell_magic("attached", "--ranks 1,3", "print('at step', step)")
        assert capsys.readouterr().out == "[rank 1] at step 3\n[rank 3] at step 3\n"
        # values both ways, as with distnb's own ranks
        ip.run_line_magic("dist_pull", "step --ranks 0-1")
        assert ip.user_ns["step"] == [3, 3]
        ip.run_line_magic("dist_pull", "flat")
        assert [tuple(t.shape) for t in ip.user_ns["flat"]] == [(9,)] * 4
        with pytest.raises(UsageError, match=r"ranks 0-3 have no 'nothere'"):
            ip.run_line_magic("dist_pull", "nothere")
        ip.user_ns["note"] = "from the notebook"
        ip.run_line_magic("dist_push", "note --ranks 2")
        capsys.readouterr()
        ip.run_cell_magic("attached", "--ranks 2", "print(note)")
        assert capsys.readouterr().out == "[rank 2] from the notebook\n"
        ip.run_line_magic("dist_attach", "--detach")
        assert set(jb.finals()) == {0, 1, 2, 3}


def magics_on(j: AttachedJob) -> InteractiveShell:
    """A real IPython shell with distnb loaded whose `%dist_attach` holds the attached `j`."""
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython() or get_ipython()
    ip.run_line_magic("load_ext", "distnb")
    magics = next(m for m in ip.magics_manager.registry.values() if isinstance(m, AttachMagics))
    magics.job = j
    return ip


def test_the_overflow_tracer_started_on_stopped_ranks_names_the_first(tmp_path: Path) -> None:
    ready = tmp_path / "READY"
    with job(tmp_path, "nan", STEPS="6", SKIP_AT="2", READY=str(ready), LINGER="1") as jb:
        j = attached(jb.folder)
        j.breakpoint(f"{TRAIN.name}:{GRADS}", cond="step == 1")
        ready.touch()
        settled(j, {0: AgentState.STOPPED, 1: AgentState.STOPPED})
        j.overflow("model")
        j.breakpoint(f"{TRAIN.name}:{GRADS}", cond="step == 3")
        j.resume()
        settled(j, {0: AgentState.STOPPED, 1: AgentState.STOPPED},
                lambda snaps: all(s.step == 3 for s in snaps))  # fmt: skip
        (view,) = j.overflow_report().values()
        assert view.summary.first_rank == 1, repr(view)
        j.detach()
        jb.wait_for(r"final 1 ")


def test_ranks_waiting_in_a_circle_across_groups(tmp_path: Path) -> None:
    circle = TRAIN.with_name("circle.py")
    pair = line_of("# my pair's", circle)
    with job(tmp_path, "circle", n=4, script=circle) as jb:
        j = attached(jb.folder)
        deadline = time.monotonic() + 120
        while not in_circle(snaps := j.snapshots()):
            assert time.monotonic() < deadline, [(s.rank, s.state, s.current) for s in snaps]
            time.sleep(0.2)
        verdicts = judged(j, lambda v: any(x.startswith("deadlock: 4 ranks wait") for x in v))
        circle_said = [v for v in verdicts if v.startswith("deadlock: 4 ranks wait")]
        for r in range(4):
            assert f"rank {r} waits in all_reduce #0 on" in circle_said[0]
            assert f"for rank {(r + 1) % 4}" in circle_said[0]
        assert f"{circle}:{pair}" in circle_said[0]
        j.detach()


def in_circle(snaps: list) -> bool:
    """Every rank in its first call on its pair's group."""
    return all(s.current is not None and s.current.seq == 0 and s.current.group != "WORLD"
               for s in snaps)  # fmt: skip
