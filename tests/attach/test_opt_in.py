"""Plain `torchrun` opted in through the environment (the lines `python -m distnb.run
--distnb-env` prints, eval'd by a shell): its launcher hosts the control plane, the ranks run the
agent, and the notebook attaches as to a job of `python -m distnb.run`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import distnb
from distnb.errors import SessionError
from distnb.records.attach import AgentState
from distnb.run import BOOT
from harness.jobs import ANSWER_S, job

pytestmark = pytest.mark.gloo


def test_the_printed_lines_opt_in_and_keep_the_pythonpath() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "distnb.run", "--distnb-env"], capture_output=True, text=True
    )
    script = f'{shown.stdout}\necho "$DISTNB_AGENT $PYTHONPATH"'
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": "/elsewhere"})  # fmt: skip
    assert done.stdout.strip() == f"1 {BOOT}{os.pathsep}/elsewhere"


def test_plain_torchrun_opted_in_is_attached_and_ends_as_usual(tmp_path: Path) -> None:
    ready = tmp_path / "READY"
    with job(tmp_path, "ok", env_opt_in=True, STEPS="4", READY=str(ready)) as jb:
        deadline = time.monotonic() + 120
        while not (jb.folder / "endpoint.json").exists():
            assert jb.proc.poll() is None and time.monotonic() < deadline, jb.log.read_text()
            time.sleep(0.1)
        assert oct((jb.folder / "secret").stat().st_mode & 0o777) == "0o600"
        j = distnb.attach(str(jb.folder), timeout=120)
        snaps = j.snapshots(ANSWER_S)
        assert [s.rank for s in snaps] == [0, 1]
        assert all(s.source == "agent" and s.state is not AgentState.GONE for s in snaps)
        assert j.link.endpoint.launcher_pid == jb.proc.pid  # torchrun's launcher hosts it
        j.detach()
        ready.touch()
        assert set(jb.finals()) == {0, 1}
        # torch's own teardown sometimes aborts a gloo worker after its script ended ("terminate
        # called without an active exception"; bench_attach sees it in jobs without the agent
        # too): torchrun then ends with 1, as the run folder says
        status, log = (jb.folder / "ended").read_text(), jb.log.read_text()
        assert status == "0" or "terminate called without an active exception" in log, log
        with pytest.raises(SessionError, match="has ended"):
            distnb.attach(str(jb.folder))
