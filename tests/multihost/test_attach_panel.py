"""JupyterLab's debugger panel on the ranks of a torchrun job across two rehearsal hosts,
attached from a real kernel on the kernel's side of the network: each rank's debugpy listens
on its own host's loopback, and the kernel reaches it through the job's signed control plane."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from harness import host_jobs as jobs
from harness.hosts import Lan, missing
from harness.jobs import START_S, TRAIN
from harness.kernel_driver import frontend
from tests.attach.test_attach_panel import BEFORE, Panel, settled, stepped_to_the_gradients
from tests.session.debugger.test_visual_debugger import switch_on

pytestmark = [
    pytest.mark.multihost,
    pytest.mark.gloo,
    pytest.mark.notebook,
    pytest.mark.skipif(bool(missing()), reason=f"rehearsal hosts need {missing()}"),
]


def test_ranks_on_two_other_hosts_in_the_panel(lan: Lan, tmp_path: Path) -> None:
    a, b = lan.hosts[0], lan.hosts[1]
    name, mark = f"panel-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    env = {"MODE": "wait", "STEPS": "5", "READY": f"/tmp/READY-{mark}"}
    here = tmp_path / "runs"
    clients = jobs.across(lan, name, mark, logs, here, **env)
    try:
        with frontend() as fe:
            dap = Panel(fe)
            status, text = dap.run(
                f"%load_ext distnb\nimport time, distnb\njob = distnb.attach("
                f"{str(here / name)!r}, timeout={START_S})\n"
                f"job.breakpoint('{TRAIN.name}:{BEFORE}', cond='step == 2')"
            )
            assert status == "ok", text
            for host in (a, b):
                (host.tmp / f"READY-{mark}").touch()
            settled(dap, "stopped", "stopped")
            switch_on(dap)
            status, text = dap.run("print(job.panel())")
            assert status == "ok" and "[0, 1]" in text, text

            stepped_to_the_gradients(dap)
            status, text = dap.run("job.detach()")
            assert status == "ok", text
        jobs.wait_for(logs, r"final 0 ")  # detached: both ranks ran to their end
        jobs.wait_for(logs, r"final 1 ")
    finally:
        jobs.end(lan, mark, clients)
        assert jobs.left(lan, mark) == []
