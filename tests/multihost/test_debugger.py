"""JupyterLab's visual debugger on a rank on another host, spoken to as JupyterLab does (a real
kernel's `debug_request`s): the rank's adapter listens on its own loopback, and the kernel
reaches it through the signed control plane."""

from __future__ import annotations

import pytest

from harness.hosts import Lan, missing
from harness.kernel_driver import frontend
from tests.session.debugger.test_visual_debugger import attach, output

pytestmark = [
    pytest.mark.multihost,
    pytest.mark.skipif(bool(missing()), reason=f"rehearsal hosts need {missing()}"),
]

RANKS = "x = rank + 41\nif rank == 1:\n    breakpoint()\ny = x * 2\nprint(socket.gethostname(), y)"


def test_a_rank_on_another_host_stops_steps_and_shows_its_variables(lan: Lan) -> None:
    h2, h3 = lan.hosts
    hosts = {h2.addr: 1, h3.addr: 1}
    with frontend() as fe:
        start = f"hosts={hosts!r}, host={lan.kernel_addr!r}, ssh_args={lan.ssh_args!r}"
        started = fe.run(f"%load_ext distnb\nimport distnb\ns = distnb.start({start})", timeout=180)
        assert started.status == "ok", started.text
        try:
            dap = attach(fe)
            dap.body("configurationDone")
            msg_id = fe.kc.execute(f"s.run('import socket\\n' + {RANKS!r})")
            stop = dap.event("stopped")
            thread = stop["threadId"]
            top = dap.body("stackTrace", threadId=thread)["stackFrames"][0]
            assert (top["name"], top["line"]) == ("[rank 1] <module>", 5)  # after breakpoint()
            ask = {"frameId": top["id"], "context": "repl"}
            assert (
                dap.body("evaluate", expression="socket.gethostname()", **ask)["result"] == "'h3'"
            )
            scopes = dap.body("scopes", frameId=top["id"])["scopes"]
            ref = scopes[0]["variablesReference"]
            names = {
                v["name"]: v["value"]
                for v in dap.body("variables", variablesReference=ref)["variables"]
            }
            assert (names["rank"], names["x"]) == ("1", "42")

            dap.body("next", threadId=thread)  # a step, relayed both ways
            assert dap.event("stopped")["threadId"] == thread
            top = dap.body("stackTrace", threadId=thread)["stackFrames"][0]
            assert top["line"] == 6
            dap.body("continue", threadId=thread)
            status, text = output(fe, msg_id, dap)
            assert status == "ok" and "[rank 0] h2 82" in text and "[rank 1] h3 84" in text, text
            dap.body("disconnect", restart=False, terminateDebuggee=False)
        finally:
            assert fe.run("s.stop()", timeout=60).status == "ok"
    assert h2.processes() == [] and h3.processes() == []
