"""Ctrl-C at each phase of `%dist_attach` on a real torchrun job, in a fresh interpreter with a
real IPython shell: each leaves one line saying what it cut and the state it left (attached or
not; which ranks are stopped or held), nothing half-done (a request numbered but not posted
would leave a rank's agent waiting for it for good), and the next command works."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from harness.jobs import in_fresh_kernel, job

pytestmark = pytest.mark.gloo

# SIGINT to its own process as `owner.method` starts (once): the interrupt comes at that phase
KERNEL = textwrap.dedent(
    """
    import os, signal, sys
    from IPython.testing.globalipapp import start_ipython
    from distnb.session.attach import AttachedJob
    from distnb.session.attach.link import Link

    def interrupt_at(owner, method):
        original = getattr(owner, method)
        def interrupted(*args, **kwargs):
            setattr(owner, method, original)
            os.kill(os.getpid(), signal.SIGINT)
            return original(*args, **kwargs)
        setattr(owner, method, interrupted)

    folder = sys.argv[1]
    ip = start_ipython()
    ip.run_line_magic("load_ext", "distnb")
    interrupt_at(Link, "registered")  # while it waits for the ranks' agents
    ip.run_cell(f"%dist_attach {folder}")
    ip.run_cell(f"%dist_attach {folder}")  # attaches
    interrupt_at(Link, "ask_each")  # while the stop is asked: it is asked whole
    ip.run_cell("%dist_attach --stop --at now --ranks 1")
    ip.run_cell("%%attached --ranks 1\\nprint('in rank', rank)")
    ip.run_cell("%dist_attach --resume")
    interrupt_at(AttachedJob, "snapshots")  # while it reads the status
    ip.run_cell("%dist_attach")
    ip.run_cell("%dist_attach --detach")
    """
)


def test_ctrl_c_at_each_phase_of_dist_attach_says_what_it_left_and_the_next_command_works(
    tmp_path: Path,
) -> None:
    with job(tmp_path, "hang", STEPS="8", SKIP_AT="3") as jb:
        jb.agents_up()
        jb.wait_for(r"final 1 ")  # rank 1 has left the loop: it sleeps in its "checkpoint"
        out = in_fresh_kernel(KERNEL, jb.folder, tmp_path / "runs")
        run = jb.folder.name
        said = [line for line in out.splitlines() if "interrupted" in line]
        assert said == [
            "KeyboardInterrupt: %dist_attach was interrupted while it attached: no job is "
            "attached; %dist_attach attaches again",
            "KeyboardInterrupt: %dist_attach was interrupted while it asked the ranks to stop: "
            f"still attached to job {run}; the stop was asked, and the ranks stop as asked "
            "(%dist_status shows where, %dist_attach --resume lets them go on)",
            "KeyboardInterrupt: %dist_attach was interrupted while it read the ranks' status: "
            f"still attached to job {run}, no rank stopped",
        ], out[-3000:]
        assert f"job {run} (2 ranks" in out, out[-3000:]  # the attach after the first
        assert "[rank 1] in rank 1" in out, out[-3000:]  # the stop was whole: rank 1 stopped
        assert "distnb: ranks 0-1 go on" in out, out[-3000:]
        assert "distnb: detached" in out, out[-3000:]
