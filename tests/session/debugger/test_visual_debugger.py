"""JupyterLab's visual debugger on the ranks, spoken to as JupyterLab speaks to it: `debug_request`
messages on a real kernel's control channel, `debug_event`s on iopub (the Debug Adapter
Protocol inside Jupyter messages), with a real 2-rank cluster behind the kernel."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.kernel_driver import Frontend, frontend

pytestmark = pytest.mark.cluster

CELL = """%%allranks --timeout 3
x = torch.ones(3) * (rank + 1)
y = x * 2
dist.all_reduce(y)
print(rank, y.tolist())"""


class Dap:
    """The frontend's debugger: requests on the control channel, events from iopub."""

    def __init__(self, fe: Frontend) -> None:
        self.fe = fe
        self.seq = 0
        self.events: list[dict[str, Any]] = []

    def request(self, command: str, timeout: float = 30, **arguments: Any) -> dict[str, Any]:
        self.seq += 1
        content = {"type": "request", "seq": self.seq, "command": command, "arguments": arguments}
        msg = self.fe.kc.session.msg("debug_request", content)
        self.fe.kc.control_channel.send(msg)
        deadline = time.monotonic() + timeout
        while True:
            reply = self.fe.kc.control_channel.get_msg(timeout=deadline - time.monotonic())
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                return dict(reply["content"])

    def body(self, command: str, **arguments: Any) -> dict[str, Any]:
        reply = self.request(command, **arguments)
        assert reply.get("success"), reply
        return dict(reply.get("body", {}))

    def event(self, name: str, timeout: float = 90) -> dict[str, Any]:
        """The next `name` debug_event (iopub's other messages are kept in `self.events`)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self.fe.kc.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"no {name!r} event within {timeout} s\n{self.seen()}"
                ) from None
            if msg["msg_type"] == "debug_event":
                again = msg["content"].get("body", {}).get("preserveFocusHint")
                if msg["content"].get("event") == name and not again:  # not a stack refresh
                    return dict(msg["content"]["body"])
            else:
                self.events.append(msg)

    def seen(self) -> str:
        """For a report: what iopub showed meanwhile, the debugger's state and the kernel's
        threads."""
        shown = "".join(_text(m) for m in self.events)
        with contextlib.suppress(Exception):
            info = self.body("debugInfo")
            shown += f"\ndebugInfo: stopped {info['stoppedThreads']}, {info['breakpoints']}"
        return f"iopub: {shown}\n{self.fe.stacks()}"


@pytest.fixture(scope="module")
def fe() -> Iterator[Frontend]:
    with frontend() as fe:
        reply = fe.run("%load_ext distnb\n%dist_start -n 2", timeout=180)
        assert reply.status == "ok", reply.text
        yield fe
        with contextlib.suppress(queue.Empty):  # no answer where nothing is attached
            Dap(fe).request("disconnect", timeout=5, restart=False)  # ranks a failure left stopped
        fe.run("%dist_stop", timeout=60)


@pytest.fixture(autouse=True)
def detached(fe: Frontend) -> Iterator[None]:
    """Each test ends with the debugger off, whatever happened: nothing left stopped."""
    yield
    dap = Dap(fe)
    if dap.body("debugInfo")["isStarted"]:
        dap.request("disconnect", restart=False, terminateDebuggee=False)


def attach(fe: Frontend) -> Dap:
    """Switch the debugger on as JupyterLab's bug icon does (`switch_on`)."""
    dap = Dap(fe)
    switch_on(dap)
    return dap


def switch_on(dap: Any) -> None:
    """As JupyterLab's bug icon does: `debugInfo`, then start the debugger (`dap`: anything
    with `body(command, **arguments)`)."""
    dap.body("debugInfo")
    dap.body(
        "initialize", clientID="jupyterlab", adapterID="python", pathFormat="path",
        linesStartAt1=True, columnsStartAt1=True, supportsVariableType=True,
    )  # fmt: skip
    dap.body("attach")


def _idle(msg: dict[str, Any], msg_id: str) -> bool:
    """Whether `msg` is the kernel's idle status after request `msg_id`."""
    state = msg["content"].get("execution_state") if msg["msg_type"] == "status" else None
    return state == "idle" and msg["parent_header"].get("msg_id") == msg_id


def _text(msg: dict[str, Any]) -> str:
    """What an iopub message shows as text (the ranks' output is a live display area)."""
    content = msg["content"]
    if msg["msg_type"] == "stream":
        return str(content["text"])
    if msg["msg_type"] == "error":
        return "\n".join(content["traceback"])
    return str(content.get("data", {}).get("text/plain", ""))


def run_with_breakpoints(
    fe: Frontend, code: str, *lines: int, **options: Any
) -> tuple[Dap, str, str]:
    """Attach, set breakpoints at `lines` of `code`'s cell (with `options`, e.g. a condition)
    and start running it: (the debugger, the cell's file, the execute request's id)."""
    dap = attach(fe)
    path = dap.body("dumpCell", code=code)["sourcePath"]
    breakpoints = [{"line": line, **options} for line in lines]
    dap.body("setBreakpoints", source={"path": path}, breakpoints=breakpoints)
    dap.body("configurationDone")
    return dap, path, fe.kc.execute(code)


def output(fe: Frontend, msg_id: str, dap: Dap, timeout: float = 60) -> tuple[str, str]:
    """The cell's status and everything it showed, once its execute_reply came."""
    texts = [_text(m) for m in dap.events]
    deadline = time.monotonic() + timeout
    while True:
        try:
            msg = fe.kc.get_shell_msg(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError("no execute_reply") from None
        if msg["parent_header"].get("msg_id") == msg_id:
            break
    # iopub trails the reply: read it until the request's idle status, which comes after
    # every output of the request (Jupyter's message ordering)
    idle = any(_idle(m, msg_id) for m in dap.events)
    while not idle:
        try:
            m = fe.kc.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError("no idle status after the execute_reply") from None
        texts.append(_text(m))
        idle = _idle(m, msg_id)
    dap.events.clear()
    return msg["content"]["status"], "\n".join(texts)


def stopped_threads(dap: Dap, n: int, timeout: float = 90) -> list[int]:
    """The stopped threads once `n` are stopped (the shown one first)."""
    deadline = time.monotonic() + timeout
    while True:
        threads = list(dap.body("debugInfo")["stoppedThreads"])
        if len(threads) >= n or time.monotonic() > deadline:
            return threads
        time.sleep(0.05)


def names(dap: Dap) -> dict[int, str]:
    return {t["id"]: t["name"] for t in dap.body("threads")["threads"]}


def variables(dap: Dap, frame: int) -> dict[str, dict[str, Any]]:
    scopes = dap.body("scopes", frameId=frame)["scopes"]
    found = dap.body("variables", variablesReference=scopes[0]["variablesReference"])
    return {v["name"]: v for v in found["variables"]}


def test_a_gutter_breakpoint_stops_both_ranks_and_peers_wait_without_a_timeout(
    fe: Frontend,
) -> None:
    dap, path, msg_id = run_with_breakpoints(fe, CELL, 3)

    shown = dap.event("stopped")["threadId"]  # the first rank to stop: the panel shows it
    other = next(t for t in stopped_threads(dap, 2) if t != shown)
    assert stopped_threads(dap, 2)[0] == shown  # JupyterLab takes the first as its thread
    threads = names(dap)
    assert {threads[shown], threads[other]} == {"rank 0", "rank 1"}
    rank = int(threads[shown].split()[1])

    frames = dap.body("stackTrace", threadId=shown)["stackFrames"]
    top = frames[0]
    # the rank runs the cell under the file the frontend knows it by: the gutter's line
    assert (top["name"], top["source"]["path"], top["line"]) == (f"[rank {rank}] <module>", path, 3)
    # the other stopped rank is listed below, to be selected
    held = frames[-1]
    assert held["name"] == f"[rank {1 - rank}] <module> (select to show)", frames
    x = variables(dap, top["id"])["x"]
    value = f"{rank + 1:.0f}."
    assert x["value"] == f"float32[3] cpu  tensor([{value}, {value}, {value}])", x
    assert x["type"] == f"Tensor {x['value']}"  # JupyterLab's tree shows the type

    dap.body("next", threadId=shown)  # the shown rank steps to the all_reduce line
    assert dap.event("stopped")["threadId"] == shown  # no other rank's stop in between
    top = dap.body("stackTrace", threadId=shown)["stackFrames"][0]
    assert (top["source"]["path"], top["line"]) == (path, 4), top
    result = dap.body("evaluate", expression="y.sum().item()", frameId=top["id"], context="repl")
    assert result["result"] == str(6.0 * (rank + 1))

    # it waits at all_reduce for the other, stopped. JupyterLab's Continue takes the shown
    # thread out of its stopped set (debugInfo filled it with both) and names the next: the
    # other rank's. The user means the rank they see.
    dap.body("continue", threadId=other)
    assert dap.event("continued")["threadId"] == shown
    assert dap.event("stopped")["threadId"] == other  # the frontend is shown the other one
    time.sleep(4)  # longer than the cell's 3 s timeout: time stopped is not the cell's
    dap.body("continue", threadId=other)
    status, text = output(fe, msg_id, dap)
    assert status == "ok", text
    assert "[rank 0] 0 [6.0, 6.0, 6.0]" in text and "[rank 1] 1 [6.0, 6.0, 6.0]" in text

    # a breakpoint() on a rank goes to the visual debugger while it is attached
    code = "%%allranks\nz = rank * 10\nif rank == 1:\n    breakpoint()\nprint('after', z)"
    msg_id = fe.kc.execute(code)
    stop = dap.event("stopped")
    top = dap.body("stackTrace", threadId=stop["threadId"])["stackFrames"][0]
    # as pdb's breakpoint(): stopped before the line after the call
    assert top["name"] == "[rank 1] <module>" and top["line"] == 5
    dap.body("continue", threadId=stop["threadId"])
    status, text = output(fe, msg_id, dap)
    assert status == "ok" and "[rank 1] after 10" in text, text

    dap.body("disconnect", restart=False, terminateDebuggee=False)
    status, text = output(fe, fe.kc.execute(CELL), dap)  # no debugger: the cell just runs
    assert status == "ok" and "[rank 1] 1 [6.0, 6.0, 6.0]" in text, text


def test_a_tensor_shows_a_preview_and_expands_to_a_clean_list(fe: Frontend) -> None:
    code = (
        "%%allranks\nbig = torch.arange(64.0).reshape(16, 4)\nbig[0, 0] = float('nan')\n"
        "w = torch.nn.Parameter(torch.ones(3))\nw.sum().backward()\nprint('seen')"
    )
    dap, _path, msg_id = run_with_breakpoints(fe, code, 6, condition="rank == 0")
    stop = dap.event("stopped")["threadId"]
    top = dap.body("stackTrace", threadId=stop)["stackFrames"][0]
    found = variables(dap, top["id"])
    assert found["big"]["value"] == "float32[16, 4] cpu  min 1 max 63 mean 32 NaN 1"
    assert found["w"]["value"] == "float32[3] cpu  tensor([1., 1., 1.])", found["w"]
    assert found["w"]["type"] == "Parameter float32[3] cpu  tensor([1., 1., 1.])"
    listed = dap.body("variables", variablesReference=found["w"]["variablesReference"])
    rows = {v["name"]: v["value"] for v in listed["variables"]}
    assert rows["shape"] == "[3]" and rows["dtype"] == "torch.float32"
    assert rows["requires_grad"] == "True"
    assert rows["grad"] == "float32[3] cpu  tensor([1., 1., 1.])"
    assert rows["values"] == "tensor([1., 1., 1.])"
    listed = dap.body("variables", variablesReference=found["big"]["variablesReference"])
    rows = {v["name"]: v["value"] for v in listed["variables"]}
    assert rows["NaN"] == "1" and rows["first 8"].startswith("tensor([nan, 1., 2.,")
    assert "Traceback" not in str(listed) and "only supported on matrices" not in str(listed)
    dap.body("continue", threadId=stop)
    status, text = output(fe, msg_id, dap)
    assert status == "ok" and "[ranks 0-1] seen" in text, text
    assert "PYDEV" not in text and "frozen modules" not in text
    dap.body("disconnect", restart=False, terminateDebuggee=False)
    # pdb after debugpy: no warning about sys.settrace in the rank's output
    reply = fe.run("%%allranks --ranks 1\nbreakpoint()\nv = 3\nprint(v)", ["n", "p v", "c"])
    assert reply.status == "ok" and "[rank 1] 3" in reply.text, reply.text
    assert "PYDEV" not in reply.text and "settrace" not in reply.text


def test_terminate_lets_the_ranks_go_and_leaves_the_debugger_off_as_the_panel_shows(
    fe: Frontend,
) -> None:
    kernel_code = "a = 20\nb = a + 1\nprint('kernel', b)"
    dap = attach(fe)
    kernel_path = dap.body("dumpCell", code=kernel_code)["sourcePath"]
    dap.body("setBreakpoints", source={"path": kernel_path}, breakpoints=[{"line": 2}])
    path = dap.body("dumpCell", code=CELL)["sourcePath"]
    dap.body("setBreakpoints", source={"path": path}, breakpoints=[{"line": 3}])
    dap.body("configurationDone")
    msg_id = fe.kc.execute(CELL)
    dap.event("stopped")
    stopped_threads(dap, 2)
    # JupyterLab's Terminate: disconnect, then initialize, attach and the breakpoints again;
    # its panel shows the debugger off and no breakpoints from the disconnect on
    dap.body("disconnect", restart=False, terminateDebuggee=False)
    reply = dap.request(
        "initialize", clientID="jupyterlab", adapterID="python", pathFormat="path",
        linesStartAt1=True, columnsStartAt1=True, supportsVariableType=True,
    )  # fmt: skip
    assert not reply["success"] and "switched the debugger off" in reply["message"], reply
    status, text = output(fe, msg_id, dap)  # nothing left stopped
    assert status == "ok" and "[rank 1] 1 [6.0, 6.0, 6.0]" in text, text
    info = dap.body("debugInfo")
    assert (info["isStarted"], info["breakpoints"], info["stoppedThreads"]) == (False, [], [])
    # the same cell, and a kernel cell, run through: no breakpoint the panel does not show
    status, text = output(fe, fe.kc.execute(CELL), dap, timeout=60)
    assert status == "ok" and "[rank 1] 1 [6.0, 6.0, 6.0]" in text, text
    status, text = output(fe, fe.kc.execute(kernel_code), dap, timeout=30)
    assert status == "ok" and "kernel 21" in text
    # the bug icon switches it on again: debugInfo first, then initialize
    assert not dap.body("debugInfo")["isStarted"]
    dap = attach(fe)
    dap.body("setBreakpoints", source={"path": path}, breakpoints=[{"line": 3}])
    dap.body("configurationDone")
    msg_id = fe.kc.execute(CELL)
    dap.event("stopped")
    dap.body("disconnect", restart=False, terminateDebuggee=False)  # off: the ranks go on
    status, text = output(fe, msg_id, dap)
    assert status == "ok" and "[rank 1] 1 [6.0, 6.0, 6.0]" in text, text


def test_step_in_to_a_function_of_a_cell_run_before_the_debugger_was_on(fe: Frontend) -> None:
    from ipykernel.compiler import get_file_name

    prefix = Dap(fe).body("debugInfo")["tmpFilePrefix"]  # the kernel's folder for cell files
    earlier = "%%allranks\ndef f(v):\n    w = v + 1\n    return w"
    status, text = output(fe, fe.kc.execute(earlier), Dap(fe))
    assert status == "ok", text
    code = "%%allranks\nr = f(rank)\nprint('r', r)"
    dap, _path, msg_id = run_with_breakpoints(fe, code, 2, condition="rank == 1")
    stop = dap.event("stopped")["threadId"]
    dap.body("stepIn", threadId=stop)
    assert dap.event("stopped")["threadId"] == stop
    top = dap.body("stackTrace", threadId=stop)["stackFrames"][0]
    # the earlier cell's file, as JupyterLab names it: the frontend finds and highlights it
    assert top["name"] == "[rank 1] f" and top["line"] == 3, top
    assert top["source"]["path"] == prefix + Path(get_file_name(earlier)).name
    source = dap.body("source", source=top["source"], sourceReference=0)
    assert source["content"] == earlier
    dap.body("continue", threadId=stop)
    status, text = output(fe, msg_id, dap)
    assert status == "ok" and "[rank 1] r 2" in text, text
    # tracebacks and call sites still say the notebook's cell
    reply = fe.run("%%allranks\nf(None)")
    assert reply.status == "error" and re.search(r"Cell In\[\d+\], line 3", reply.text), reply.text
    dap.body("disconnect", restart=False, terminateDebuggee=False)


def test_selecting_a_held_ranks_frame_shows_that_rank(fe: Frontend) -> None:
    dap, path, msg_id = run_with_breakpoints(fe, CELL, 3)
    shown = dap.event("stopped")["threadId"]
    other = next(t for t in stopped_threads(dap, 2) if t != shown)
    held = dap.body("stackTrace", threadId=shown)["stackFrames"][-1]
    assert "(select to show)" in held["name"]
    dap.body("scopes", frameId=held["id"])  # JupyterLab asks the selected frame's scopes
    assert dap.event("stopped")["threadId"] == other  # shown: its stack first, to the frontend
    # a request still naming the thread shown before is for the rank the user selected
    dap.body("next", threadId=shown)
    assert dap.event("stopped")["threadId"] == other
    top = dap.body("stackTrace", threadId=other)["stackFrames"][0]
    assert (top["source"]["path"], top["line"]) == (path, 4)
    assert stopped_threads(dap, 2)[0] == other
    dap.body("disconnect", restart=False, terminateDebuggee=False)
    status, text = output(fe, msg_id, dap)
    assert status == "ok", text


def test_a_condition_picks_the_rank_and_kernel_cells_keep_the_kernels_debugger(
    fe: Frontend,
) -> None:
    dap, path, msg_id = run_with_breakpoints(fe, CELL, 3, condition="rank == 1")
    stop = dap.event("stopped")
    threads = {t["id"]: t["name"] for t in dap.body("threads")["threads"]}
    assert threads[stop["threadId"]] == "rank 1"
    assert dap.body("debugInfo")["stoppedThreads"] == [stop["threadId"]]  # rank 0 runs on
    dap.body("continue", threadId=stop["threadId"])
    status, text = output(fe, msg_id, dap)
    assert status == "ok" and "[rank 0] 0 [6.0, 6.0, 6.0]" in text, text

    # a cell of the kernel's own: ipykernel's debugger, its own thread
    code = "a = 20\nb = a + 1\nprint('kernel', b)"
    path = dap.body("dumpCell", code=code)["sourcePath"]
    dap.body("setBreakpoints", source={"path": path}, breakpoints=[{"line": 2}])
    msg_id = fe.kc.execute(code)
    stop = dap.event("stopped")
    assert stop["threadId"] < 1 << 32  # not a rank's
    top = dap.body("stackTrace", threadId=stop["threadId"])["stackFrames"][0]
    assert (top["source"]["path"], top["line"], top["name"]) == (path, 2, "<module>")
    dap.body("continue", threadId=stop["threadId"])
    status, text = output(fe, msg_id, dap)
    assert status == "ok" and "kernel 21" in text, text
    dap.body("setBreakpoints", source={"path": path}, breakpoints=[])
    dap.body("disconnect", restart=False, terminateDebuggee=False)


def test_disconnecting_lets_stopped_ranks_go_on(fe: Frontend) -> None:
    dap, _path, msg_id = run_with_breakpoints(fe, CELL, 3)
    dap.event("stopped")
    stopped_threads(dap, 2)
    dap.body("disconnect", restart=False, terminateDebuggee=False)
    status, text = output(fe, msg_id, dap)
    assert status == "ok" and "[rank 1] 1 [6.0, 6.0, 6.0]" in text, text


def test_switching_off_and_on_again_keeps_every_ranks_adapter(fe: Frontend) -> None:
    """debugpy answers `disconnect` just after its `terminated` event, and an adapter that
    cannot write that answer exits: a kernel closing its end on `terminated` lost a rank's
    adapter for good, now and then (often on a loaded machine)."""
    for _ in range(8):  # each time, the kernel connects to both ranks' adapters again
        dap, _path, msg_id = run_with_breakpoints(fe, CELL, 3)
        dap.event("stopped")
        assert len(stopped_threads(dap, 2)) == 2
        dap.body("disconnect", restart=False, terminateDebuggee=False)
        status, text = output(fe, msg_id, dap)
        assert status == "ok" and "cannot reach" not in text, text


def test_a_new_cluster_while_attached_is_debugged_too(fe: Frontend) -> None:
    dap = attach(fe)
    dap.body("configurationDone")
    status, text = output(fe, fe.kc.execute(CELL), dap)  # connects to these ranks
    assert status == "ok", text
    for code in ("%dist_stop", "%dist_start -n 2"):
        status, text = output(fe, fe.kc.execute(code), dap, timeout=180)
        assert status == "ok", text
    path = dap.body("dumpCell", code=CELL)["sourcePath"]
    dap.body("setBreakpoints", source={"path": path}, breakpoints=[{"line": 5}])
    msg_id = fe.kc.execute(CELL)
    for _ in range(2):  # one rank shown at a time; continuing it shows the other
        thread = dap.event("stopped")["threadId"]
        top = dap.body("stackTrace", threadId=thread)["stackFrames"][0]
        assert (top["source"]["path"], top["line"]) == (path, 5)
        dap.body("continue", threadId=thread)
    status, text = output(fe, msg_id, dap)
    assert status == "ok" and "[rank 1] 1 [6.0, 6.0, 6.0]" in text, text
    dap.body("disconnect", restart=False, terminateDebuggee=False)


SCRIPT = """\
import torch
import torch.distributed as dist
def scale(t):
    return t * 3
x = torch.ones(2) * (dist.get_rank() + 1)
y = scale(x)
dist.all_reduce(y)
print("script", dist.get_rank(), y.tolist())
"""


def test_a_breakpoint_in_a_script_stops_its_ranks(fe: Frontend, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    dap = attach(fe)
    dap.body("setBreakpoints", source={"path": str(script)}, breakpoints=[{"line": 4}])
    dap.body("configurationDone")
    msg_id = fe.kc.execute(f"%dist_run {script}")
    for _ in range(2):
        thread = dap.event("stopped")["threadId"]
        top = dap.body("stackTrace", threadId=thread)["stackFrames"][0]
        assert (top["source"]["path"], top["line"]) == (str(script), 4)
        assert re.fullmatch(r"\[rank [01]\] scale", top["name"]), top
        dap.body("continue", threadId=thread)
    status, text = output(fe, msg_id, dap)
    assert status == "ok" and "[rank 1] script 1 [9.0, 9.0]" in text, text
    dap.body("disconnect", restart=False, terminateDebuggee=False)


def test_a_rank_that_dies_while_stopped_is_named_and_leaves_the_panel(fe: Frontend) -> None:
    reply = fe.run("%%allranks\nimport os\nprint(os.getpid())")
    pid = int(reply.text.split("[rank 1] ")[1].split()[0])
    dap, _path, msg_id = run_with_breakpoints(fe, CELL, 3)
    dap.event("stopped")
    threads = names(dap)
    rank1 = next(t for t in stopped_threads(dap, 2) if threads[t] == "rank 1")
    os.kill(pid, signal.SIGKILL)
    # the panel lets it go
    deadline = time.monotonic() + 30
    while rank1 in dap.body("debugInfo")["stoppedThreads"]:
        assert time.monotonic() < deadline, "rank 1 still listed as stopped"
        time.sleep(0.05)
    status, text = output(fe, msg_id, dap)
    assert status == "error" and "RankDiedError: rank 1" in text, text
    dap.body("disconnect", restart=False, terminateDebuggee=False)  # rank 0 was still stopped
