"""A real Jupyter kernel driven as a frontend drives it: the tests' one way to run its cells.

- `execute(kc, code)`: run a cell and keep every iopub message it caused (streams, displays and
  their updates, widgets' comm messages, errors) and its execute_reply, as a frontend gets them;
- `Frontend.run`: the same as a user at the notebook does it, answering input requests.
  nbclient cannot answer `input_request`s; `Frontend.run` sends a cell with `allow_stdin=True`,
  reads iopub and the stdin channel together, and answers each prompt from a script of answers
  (or a function of the prompt), as a user types into the input box.
"""

from __future__ import annotations

import contextlib
import queue
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from harness.processes import remove_kernel_files

ANSI = re.compile(r"\x1b\[[0-9;]*m")

Answer = str | Callable[[str], str | None]  # None from a function: interrupt the kernel


@dataclass
class Executed:
    """A cell's execute_reply (`reply`) and every iopub message it caused, in order
    (`messages`: each message's content with its `type`)."""

    reply: dict[str, Any]
    messages: list[dict[str, Any]]

    @property
    def status(self) -> str:
        return str(self.reply["status"])

    @property
    def text(self) -> str:
        """What it printed, displayed (as text) and raised, without colour codes. Consecutive
        stream messages are joined as written: a kernel may split one print across several."""
        parts: list[str] = []
        previous = ""
        for m in self.messages:
            if m["type"] == "stream" and previous == "stream":
                parts[-1] += m["text"]
            elif m["type"] == "stream":
                parts.append(m["text"])
            elif m["type"] == "error":
                parts.append("\n".join(m["traceback"]))
            elif "data" in m:
                parts.append(m["data"].get("text/plain", ""))
            previous = m["type"]
        return ANSI.sub("", "\n".join(parts))

    def of_type(self, *kinds: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["type"] in kinds]


def execute(kc: Any, code: str, timeout: float = 120) -> Executed:
    """Run `code` in the kernel behind client `kc` (no input allowed) and wait until it is
    idle again."""
    msg_id = kc.execute(code)
    messages = []
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
        messages.append({"type": msg["msg_type"], **msg["content"]})
    while True:
        reply = kc.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            return Executed(dict(reply["content"]), messages)


@contextmanager
def kernel(cwd: str | None = None, env: dict[str, str] | None = None) -> Iterator[tuple[Any, Any]]:
    """A new python3 kernel: (its manager, a client with channels started); shut down after.
    `env`: its whole environment (else this process's)."""
    from jupyter_client.manager import start_new_kernel

    options = {name: value for name, value in (("cwd", cwd), ("env", env)) if value}
    km, kc = start_new_kernel(kernel_name="python3", **options)
    pid = km.provisioner.pid
    try:
        yield km, kc
    finally:
        kc.stop_channels()
        if km.is_alive():
            km.shutdown_kernel(now=True)
        remove_kernel_files([pid])


@dataclass
class Reply:
    """What one cell did: status, every prompt it asked (in order), its text output."""

    status: str
    prompts: list[str] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    content: dict[str, Any] = field(default_factory=dict)
    shown: dict[str, str] = field(default_factory=dict)  # live display areas, by display id

    @property
    def text(self) -> str:
        """Everything shown, in the order a notebook shows it: streams, display areas (with
        their last content, where they were created), results and errors."""
        return self._joined(with_prompts=False)

    @property
    def transcript(self) -> str:
        """`text` with each answered prompt where the notebook shows it: the prompt and the
        line typed (`[rank 1] (Pdb) p x`), between the outputs that came before and after."""
        return self._joined(with_prompts=True)

    def _joined(self, with_prompts: bool) -> str:
        parts = []
        for out in self.outputs:
            if out["type"] == "stream":
                parts.append(out["text"])
            elif out["type"] == "error":
                parts.append("\n".join(out["traceback"]))
            elif out["type"] == "area":
                parts.append(self.shown[out["id"]])
            elif out["type"] == "stdin":
                parts += [out["text"]] if with_prompts else []
            elif "data" in out:
                parts.append(out["data"].get("text/plain", ""))
        return ANSI.sub("", "\n".join(parts))


class Frontend:
    """One kernel and its client (`with frontend() as fe:`)."""

    def __init__(self, km: Any, kc: Any) -> None:
        self.km, self.kc = km, kc
        self.last_password = False  # the last prompt asked for hidden input

    def stacks(self) -> str:
        """Where the kernel's threads are now, and its ranks' (py-spy, installed with the
        tests), for the report of a cell that did not end: a hang says where it hangs."""
        import subprocess
        import sys
        from pathlib import Path

        import psutil

        pid = getattr(getattr(self.km, "provisioner", None), "pid", None)
        spy = Path(sys.executable).with_name("py-spy")
        if pid is None or not spy.exists():
            return "(no stacks: no kernel pid or no py-spy)"
        found = []
        with contextlib.suppress(psutil.Error):
            kernel = psutil.Process(pid)
            children = [p for p in kernel.children(recursive=True) if "python" in p.name()]
            for process in [kernel, *children]:
                done = subprocess.run(
                    [str(spy), "dump", "--pid", str(process.pid)],
                    capture_output=True, text=True, timeout=60,
                )  # fmt: skip
                found.append(f"{' '.join(process.cmdline()[-3:])}:\n{done.stdout}{done.stderr}")
        return "the threads of the kernel and its processes:\n" + "\n".join(found)

    def run(
        self,
        code: str,
        answers: Sequence[Answer] = (),
        allow_stdin: bool = True,
        timeout: float = 120,
    ) -> Reply:
        """Run `code`; answer its prompts with `answers` in order (a function gets the prompt and
        returns the line, or None to interrupt the kernel instead)."""
        msg_id = self.kc.execute(code, allow_stdin=allow_stdin)
        reply = Reply("")
        pending = list(answers)
        deadline = time.monotonic() + timeout
        idle = False
        while not idle:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no reply in {timeout} s: {reply.prompts}\n{reply.text}\n{self.stacks()}"
                )
            try:
                request = self.kc.get_stdin_msg(timeout=0.01)
            except queue.Empty:
                request = None
            if request is not None:
                prompt = request["content"]["prompt"]
                self.last_password = bool(request["content"].get("password"))
                reply.prompts.append(prompt)
                if not pending:
                    raise AssertionError(f"unexpected prompt {prompt!r}\n{reply.text}")
                self._settle(msg_id, reply)  # what came before the prompt shows above it
                answer = pending.pop(0)
                line = answer(prompt) if callable(answer) else answer
                if line is None:
                    self.km.interrupt_kernel()
                else:
                    reply.outputs.append({"type": "stdin", "text": f"{prompt}{line}"})
                    self.kc.input(line)
            idle = self._drain(msg_id, reply)
        reply.content = self._shell_reply(msg_id, deadline)
        reply.status = reply.content["status"]
        if pending:
            raise AssertionError(f"{len(pending)} answers left: {reply.prompts}\n{reply.text}")
        return reply

    def _settle(self, msg_id: str, reply: Reply, quiet: float = 0.2) -> None:
        """Read iopub until it has been quiet for `quiet` s, as a user reads the screen before
        typing (iopub and stdin are separate channels: output sent just before a prompt may
        arrive just after it)."""
        last = time.monotonic()
        while time.monotonic() - last < quiet:
            before = len(reply.outputs), dict(reply.shown)
            self._drain(msg_id, reply)
            if (len(reply.outputs), reply.shown) != before:
                last = time.monotonic()

    def _shell_reply(self, msg_id: str, deadline: float) -> dict[str, Any]:
        """The execute_reply to `msg_id` (a reply to an earlier request may come first)."""
        while True:
            msg = self.kc.get_shell_msg(timeout=max(1.0, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") == msg_id:
                return dict(msg["content"])

    def _drain(self, msg_id: str, reply: Reply) -> bool:
        """Read the iopub messages there are; True once the cell's kernel is idle."""
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.01)
            except queue.Empty:
                return False
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "status" and content["execution_state"] == "idle":
                return True
            display_id = content.get("transient", {}).get("display_id")
            if kind in ("display_data", "update_display_data") and display_id:
                if display_id not in reply.shown:
                    reply.outputs.append({"type": "area", "id": display_id})
                reply.shown[display_id] = content["data"].get("text/plain", "")
            elif kind in ("stream", "display_data", "execute_result", "error"):
                reply.outputs.append({"type": kind, **content})


@contextmanager
def frontend(cwd: str | None = None, env: dict[str, str] | None = None) -> Iterator[Frontend]:
    with kernel(cwd, env) as (km, kc):
        yield Frontend(km, kc)


@contextmanager
def with_ranks(n: int = 2, timeout: float = 180) -> Iterator[Frontend]:
    """A frontend on a kernel with distnb loaded and `n` ranks started; stopped after."""
    with frontend() as fe:
        reply = fe.run(f"%load_ext distnb\n%dist_start -n {n}", timeout=timeout)
        assert reply.status == "ok", reply.text
        yield fe
        fe.run("%dist_stop", timeout=60)
