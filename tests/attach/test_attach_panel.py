"""JupyterLab's debugger panel on the stopped ranks of a real torchrun job, attached from a real
kernel: the debug requests sent as JupyterLab sends them (`debug_request` on the control
channel, `debug_event`s on iopub), a rank stepped and continued in the panel, the other
resumed by detach; a peer held while a rank is stopped in the panel, breakpoints set before
and after the rank went to the panel stopping it there, `resume`, and a kernel killed
meanwhile; each job's result the same as a run never attached."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from harness.jobs import TRAIN, Job, job, line_of
from harness.kernel_driver import ANSI, Frontend, frontend
from tests.session.debugger.test_visual_debugger import Dap, names, switch_on, variables

pytestmark = [pytest.mark.gloo, pytest.mark.notebook]

BEFORE = line_of("flat = grads_of(model)")  # the line before the gradients' all_reduce
GRADS = line_of("# the gradients")
METRICS = line_of("# the metrics")
STEPS = "5"


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """Each rank's final loss (all its bits) in the same job never attached."""
    tmp = tmp_path_factory.mktemp("plain")
    with job(tmp, "wait", STEPS=STEPS, agent=False) as plain:
        finals = plain.finals()
    assert len(finals) == 2
    return finals


@contextmanager
def attached(tmp_path: Path) -> Iterator[tuple[Job, Panel]]:
    """A job waiting for READY before each step, attached as `job` in a real kernel (also the
    job of its `%dist_attach`), and the kernel's debugger spoken to as JupyterLab does."""
    ready = tmp_path / "READY"
    with job(tmp_path, "wait", STEPS=STEPS, READY=str(ready)) as jb, frontend() as fe:
        deadline = time.monotonic() + 120
        while not (jb.folder / "endpoint.json").exists():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        dap = Panel(fe)
        status, text = dap.run(
            f"%load_ext distnb\nimport distnb\njob = distnb.attach({str(jb.folder)!r}, "
            "timeout=120)\nget_ipython().magics_manager.registry['AttachMagics'].job = job"
        )
        assert status == "ok", text
        yield jb, dap


def settled(dap: Panel, *states: str) -> None:
    """Wait in the kernel until the ranks' states are `states`."""
    status, text = dap.run(
        f"deadline = time.monotonic() + 120\nwhile [s.state.value for s in job.snapshots()] "
        f"!= {list(states)!r}:\n    assert time.monotonic() < deadline, job.snapshots()\n"
        "    time.sleep(0.2)"
    )
    assert status == "ok", text


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


def stepped_to_the_gradients(dap: Panel) -> tuple[int, int]:
    """The rank the panel shows first, stopped before step 2's gradients with its variables,
    then one Next to the gradients' all_reduce (not over it): its thread and its rank."""
    shown = dap.event("stopped")["threadId"]
    rank = int(names(dap)[shown].split()[1])
    frame = top(dap, shown)
    assert (frame["name"], frame["source"]["path"], frame["line"]) == (
        f"[rank {rank}] main",
        str(TRAIN),
        BEFORE,
    )
    assert variables(dap, frame["id"])["step"]["value"] == "2"
    dap.body("next", threadId=shown)
    assert dap.event("stopped")["threadId"] == shown
    assert top(dap, shown)["line"] == GRADS
    return shown, rank


def top(dap: Panel, thread: int) -> dict[str, Any]:
    return dict(dap.body("stackTrace", threadId=thread)["stackFrames"][0])


def test_the_panel_steps_and_continues_attached_ranks_and_the_job_ends_as_unattached(
    tmp_path: Path, expected: dict[int, str]
) -> None:
    with attached(tmp_path) as (jb, dap):
        status, text = dap.run(f"import time\njob.breakpoint('{TRAIN.name}:{BEFORE}', "
                               "cond='step == 2')")  # fmt: skip
        assert status == "ok", text
        (tmp_path / "READY").touch()
        settled(dap, "stopped", "stopped")
        status, text = dap.run("%dist_attach --panel")  # the debugger is off: how to switch on
        assert status == "error" and "switch it on (the bug icon" in text, text
        status, text = dap.run("_ = job.run(\"'pydevd' in __import__('sys').modules\")")
        assert "[rank 0] False" in text and "[rank 1] False" in text, text  # only when asked
        switch_on(dap)
        status, text = dap.run("%dist_attach --panel")
        assert status == "ok" and "JupyterLab's debugger panel shows ranks 0-1" in text, text

        shown, rank = stepped_to_the_gradients(dap)
        threads = names(dap)
        assert {"rank 0", "rank 1"} <= set(threads.values()), threads
        flat = variables(dap, top(dap, shown)["id"])["flat"]["value"]
        assert flat.startswith("float32[9] cpu  tensor(["), flat
        status, text = dap.run("print([s.state.value for s in job.snapshots()])")
        assert "['stopped', 'stopped']" in text, text

        dap.body("continue", threadId=shown)  # the panel shows the other rank, stopped
        other = dap.event("stopped")["threadId"]
        assert names(dap)[other] == f"rank {1 - rank}"
        assert top(dap, other)["line"] == BEFORE

        status, text = dap.run("job.detach()")  # resumes the other rank too
        assert status == "ok", text
        assert jb.finals() == expected


def test_a_peer_is_held_a_new_breakpoint_stops_in_the_panel_and_a_dead_kernel_lets_go(
    tmp_path: Path, expected: dict[int, str]
) -> None:
    with attached(tmp_path) as (jb, dap):
        switch_on(dap)
        status, text = dap.run("job.panel(wait_s=1)")  # before any rank stopped: said so
        assert status == "error" and "no rank is stopped: stop ranks first" in text, text
        status, text = dap.run("import time\njob.stop([0])")  # rank 1 held meanwhile
        assert status == "ok", text
        (tmp_path / "READY").touch()
        settled(dap, "stopped", "held")
        status, text = dap.run(f"job.breakpoint('{TRAIN.name}:{METRICS}', ranks=[0])")
        assert status == "ok", text  # noted for pdb, not set yet: the panel's once it shows
        status, text = dap.run("print(job.panel())")
        assert status == "ok" and "[0]" in text, text
        shown = dap.event("stopped")["threadId"]
        assert names(dap)[shown] == "rank 0"
        assert top(dap, shown)["line"] == GRADS  # stopped before its all_reduce
        settled(dap, "stopped", "held")

        dap.body("continue", threadId=shown)  # the all_reduce needs rank 1: released
        shown = dap.event("stopped")["threadId"]
        assert names(dap)[shown] == "rank 0"
        frame = top(dap, shown)
        assert frame["line"] == METRICS
        assert variables(dap, frame["id"])["step"]["value"] == "0"

        status, text = dap.run(f"job.breakpoint('{TRAIN.name}:{BEFORE}', 'step == 1', [0])")
        assert status == "ok", text  # set in rank 0's debugpy, at once
        status, text = dap.run("job.resume()")  # rank 0 goes on, to the new breakpoint
        assert status == "ok", text
        frame = top(dap, dap.event("stopped")["threadId"])
        assert frame["line"] == BEFORE
        assert variables(dap, frame["id"])["step"]["value"] == "1"

        dap.fe.km.shutdown_kernel(now=True)  # the notebook dies with rank 0 in the panel
        # debugpy let it go and forgot the breakpoint; rank 1's hold ended with the lease
        assert jb.finals() == expected
