"""Which rank JupyterLab's panel shows while the shown rank steps, spoken to as JupyterLab speaks
to it (`test_visual_debugger`): a step over a collective that waits for a held rank shows that
rank as soon as the stepping rank says so (its beacon), not after a guess at how long a step
takes on a busy machine."""

from __future__ import annotations

import time

import pytest

from distnb.session.debugger.panel import STEP_QUIET_S
from harness.kernel_driver import Frontend
from tests.session.debugger.test_visual_debugger import (
    CELL,
    fe,
    output,
    run_with_breakpoints,
    stopped_threads,
)

__all__ = ["fe"]  # the kernel and its 2 ranks, as in test_visual_debugger

pytestmark = pytest.mark.cluster


def test_a_step_over_a_collective_waiting_for_a_held_rank_shows_that_rank(fe: Frontend) -> None:
    dap, _path, msg_id = run_with_breakpoints(fe, CELL, 4)  # line 4: dist.all_reduce(y)
    shown = dap.event("stopped")["threadId"]
    held = next(t for t in stopped_threads(dap, 2) if t != shown)
    start = time.monotonic()
    dap.body("next", threadId=shown)
    assert dap.event("continued")["threadId"] == shown
    assert dap.event("stopped")["threadId"] == held  # the rank the step waits for
    assert time.monotonic() - start < STEP_QUIET_S, "shown on time, not on the rank's word"
    dap.body("continue", threadId=held)  # both go on: the stepped rank stops at line 5
    assert dap.event("stopped")["threadId"] == shown
    dap.body("continue", threadId=shown)
    status, text = output(fe, msg_id, dap)
    assert status == "ok" and "[rank 1] 1 [6.0, 6.0, 6.0]" in text, text
    dap.body("disconnect", restart=False, terminateDebuggee=False)
