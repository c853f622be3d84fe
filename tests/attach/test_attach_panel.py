"""JupyterLab's debugger panel on the stopped ranks of a real torchrun job, attached from a real
kernel: the debug requests sent as JupyterLab sends them (`debug_request` on the control
channel, `debug_event`s on iopub), a rank stepped and continued in the panel, the other
resumed by detach, and the job's result the same as a run never attached."""

from __future__ import annotations

import queue
import time
from pathlib import Path
from typing import Any

import pytest

from tests.attach.jobs import TRAIN, job, line_of
from tests.kernel_driver import ANSI, Frontend, frontend
from tests.session.test_visual_debugger import Dap, names, variables

pytestmark = [pytest.mark.gloo, pytest.mark.notebook]

BEFORE = line_of("flat = grads_of(model)")  # the line before the gradients' all_reduce
GRADS = line_of("# the gradients")


class Panel(Dap):
    """`Dap` whose events may also have come while a cell ran (`run` keeps them)."""

    def __init__(self, fe: Frontend) -> None:
        super().__init__(fe)
        self.backlog: list[dict[str, Any]] = []

    def event(self, name: str, timeout: float = 90) -> dict[str, Any]:
        for i, msg in enumerate(self.backlog):
            if msg["content"].get("event") == name:
                del self.backlog[: i + 1]
                return dict(msg["content"]["body"])
        self.backlog.clear()
        return super().event(name, timeout)

    def run(self, code: str, timeout: float = 180) -> tuple[str, str]:
        """Run a cell: its status and what it showed; debug events meanwhile are kept."""
        kc = self.fe.kc
        msg_id = kc.execute(code)
        texts, deadline = [], time.monotonic() + timeout
        while True:
            try:
                msg = kc.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"{code!r}: no idle status in {timeout} s") from None
            if msg["msg_type"] == "debug_event":
                self.backlog.append(msg)
            elif msg["parent_header"].get("msg_id") == msg_id:
                content = msg["content"]
                if msg["msg_type"] == "status" and content["execution_state"] == "idle":
                    break
                texts.append(content.get("text") or "\n".join(content.get("traceback", [])))
        while (reply := kc.get_shell_msg(timeout=timeout))["parent_header"].get("msg_id") != msg_id:
            pass
        return str(reply["content"]["status"]), ANSI.sub("", "".join(texts))


def switch_on(dap: Panel) -> None:
    """As JupyterLab's bug icon does (`test_visual_debugger.attach`)."""
    dap.body("debugInfo")
    dap.body(
        "initialize", clientID="jupyterlab", adapterID="python", pathFormat="path",
        linesStartAt1=True, columnsStartAt1=True, supportsVariableType=True,
    )  # fmt: skip
    dap.body("attach")


def top(dap: Panel, thread: int) -> dict[str, Any]:
    return dict(dap.body("stackTrace", threadId=thread)["stackFrames"][0])


def test_the_panel_steps_and_continues_attached_ranks_and_the_job_ends_as_unattached(
    tmp_path: Path,
) -> None:
    ready = tmp_path / "READY"
    ready.touch()
    with job(tmp_path, "wait", STEPS="5", READY=str(ready), agent=False) as plain:
        expected = plain.finals()
    ready.unlink()
    with job(tmp_path, "wait", STEPS="5", READY=str(ready)) as jb, frontend() as fe:
        deadline = time.monotonic() + 120
        while not (jb.folder / "endpoint.json").exists():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        dap = Panel(fe)
        status, text = dap.run(
            f"%load_ext distnb\nimport distnb\njob = distnb.attach({str(jb.folder)!r}, "
            f"timeout=120)\njob.breakpoint('{TRAIN.name}:{BEFORE}', cond='step == 2')\n"
            "get_ipython().magics_manager.registry['AttachMagics'].job = job"
        )
        assert status == "ok", text
        ready.touch()
        status, text = dap.run(WAIT_STOPPED)
        assert status == "ok", text
        status, text = dap.run("%dist_attach --panel")  # the debugger is off: how to switch on
        assert status == "error" and "switch it on (the bug icon" in text, text
        switch_on(dap)
        status, text = dap.run("%dist_attach --panel")
        assert status == "ok" and "JupyterLab's debugger panel shows ranks 0-1" in text, text

        shown = dap.event("stopped")["threadId"]
        threads = names(dap)
        assert {"rank 0", "rank 1"} <= set(threads.values()), threads
        rank = int(threads[shown].split()[1])
        frame = top(dap, shown)
        assert (frame["name"], frame["source"]["path"], frame["line"]) == (
            f"[rank {rank}] main",
            str(TRAIN),
            BEFORE,
        )
        assert variables(dap, frame["id"])["step"]["value"] == "2"

        dap.body("next", threadId=shown)  # to the gradients' all_reduce, not over it
        assert dap.event("stopped")["threadId"] == shown
        frame = top(dap, shown)
        assert frame["line"] == GRADS
        flat = variables(dap, frame["id"])["flat"]["value"]
        assert flat.startswith("float32[9] cpu  tensor(["), flat
        status, text = dap.run("print([s.state.value for s in job.snapshots()])")
        assert "['stopped', 'stopped']" in text, text

        dap.body("continue", threadId=shown)  # the panel shows the other rank, stopped
        other = dap.event("stopped")["threadId"]
        assert names(dap)[other] == f"rank {1 - rank}"
        assert top(dap, other)["line"] == BEFORE

        status, text = dap.run("job.detach()")  # resumes the other rank too
        assert status == "ok", text
        assert jb.finals() == expected and len(expected) == 2


WAIT_STOPPED = """
import time
from distnb.records.attach import AgentState
deadline = time.monotonic() + 120
while not all(s.state is AgentState.STOPPED for s in job.snapshots()):
    assert time.monotonic() < deadline, job.snapshots()
    time.sleep(0.2)
"""
