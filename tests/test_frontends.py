"""distnb as users meet it: terminal IPython in a real pseudo-terminal, and a real Jupyter kernel.

Start-up progress (tqdm: text in a terminal, a widget in Jupyter), tqdm bars and widgets made on
the ranks (text in a terminal, without breaking ipyparallel's output dispatch; relayed widgets in
Jupyter), and auto mode (the prompt, `%%local`, off again). In the terminal: ranks' lines as they
come, Ctrl-C and errors in their one message, distnb's own goodbye at exit.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import kernel_driver
from harness.kernel_driver import execute
from harness.processes import plain

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parent.parent
PROMPT = re.compile(r"(\[[^\]\r\n]*\] )?In \[\d+\]: ")
WIDGET = "application/vnd.jupyter.widget-view+json"


class Terminal:
    """`ipython` in a pseudo-terminal; `run` types a cell and returns what it printed."""

    def __init__(self, ipython_dir: Path) -> None:
        import pexpect

        self.child = pexpect.spawn(
            sys.executable,
            [
                "-m",
                "IPython",
                "--simple-prompt",
                "--colors=NoColor",
                "--no-banner",
                "--TerminalInteractiveShell.term_title=False",
            ],
            cwd=str(ROOT),
            # PYTHONFAULTHANDLER: a prompt that never comes back is failed with every thread's
            # stack (`wait` sends SIGABRT), not only with the screen's last line
            env={**os.environ, "IPYTHONDIR": str(ipython_dir), "PYTHONFAULTHANDLER": "1"},
            encoding="utf-8",
            timeout=180,
            dimensions=(50, 200),
        )
        self.prompt = self.wait()

    def run(self, cell: str) -> str:
        self.type(cell)
        return self.wait()

    def type(self, cell: str) -> None:
        """Type a cell and leave it running."""
        # The simple prompt reads line by line: a cell magic ends at its second blank line.
        blank = "\r\r" if cell.startswith("%%") else ""
        self.child.send(cell.replace("\n", "\r") + "\r" + blank)

    def expect(self, pattern: str) -> str:
        """Wait until `pattern` is on the screen; return what it matched."""
        self.child.expect(pattern)
        return plain(self.child.after)

    def wait(self) -> str:
        import pexpect

        try:
            self.child.expect(PROMPT)
        except pexpect.TIMEOUT:
            self.child.kill(signal.SIGABRT)
            self.child.expect([pexpect.EOF, pexpect.TIMEOUT], timeout=10)
            pytest.fail(f"no prompt; the terminal's last output and stacks:\n{self.child.before}")
        self.prompt = plain(self.child.after)
        return plain(self.child.before.replace("\r\n", "\n"))

    def close(self) -> None:
        if self.child.isalive():
            self.child.sendline("exit")
            self.child.expect(["\\$", "\\#", "exit", pytest.importorskip("pexpect").EOF])
            self.child.close(force=True)


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    term = Terminal(tmp_path)
    yield term
    term.close()


def test_terminal_ipython_progress_rank_widgets_and_auto_mode(terminal: Terminal) -> None:
    terminal.run("%load_ext distnb")
    out = terminal.run("%dist_start -n 2")
    assert "distnb: ranks joined the process group" in out and "2/2" in out  # tqdm, as text
    assert "memory (peak)" in out

    out = terminal.run(
        "%%allranks\nfrom tqdm.auto import tqdm\nfor i in tqdm(range(5)):\n    pass\n"
        "print('looped', rank)"
    )
    assert "[rank 1] looped 1" in out and "5/5" in out
    assert "AttributeError" not in out and "Uncaught exception" not in out
    out = terminal.run("%%allranks\nprint('after', rank)")
    # a later cell's output still arrives (it once waited ~4 s for output that never came)
    assert "[rank 1] after 1" in out
    out = terminal.run("%%allranks\nimport ipywidgets\ndisplay(ipywidgets.IntSlider(rank + 5))")
    assert "[rank 1] IntSlider(value=6)" in out

    terminal.run("%dist_auto on")
    assert terminal.prompt.startswith("[ranks 0-1] In [")
    out = terminal.run("print('auto', rank + 40)")
    assert "[rank 0] auto 40" in out and "[rank 1] auto 41" in out
    out = terminal.run("%%local\nprint('local', 'rank' in dir())")
    assert "local False" in out and "[rank" not in out
    terminal.run("%dist_auto off")
    assert terminal.prompt.startswith("In [")
    out = terminal.run("print('kernel', 1 + 1)")
    assert "kernel 2" in out and "[rank" not in out
    terminal.run("%dist_stop")


def test_terminal_shows_lines_as_they_come_and_messages_without_internals(
    terminal: Terminal, tmp_path: Path
) -> None:
    pexpect = pytest.importorskip("pexpect")
    terminal.run("%load_ext distnb")
    assert "memory (peak)" in terminal.run("%dist_start -n 2")

    # live: the ranks wait for a file that the test makes only once it has seen their first
    # lines on the screen, so those lines came while the cell still ran
    go = tmp_path / "go"
    terminal.type(
        "%%allranks\nimport os, time\nprint('before', rank, flush=True)\n"
        f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.01)\nprint('after', rank)"
    )
    seen = {terminal.expect(r"\[rank \d\] before \d") for _ in range(2)}
    assert seen == {"[rank 0] before 0", "[rank 1] before 1"}
    go.touch()
    out = terminal.wait()
    assert "[rank 0] after 0" in out and "[rank 1] after 1" in out and "before" not in out

    # Ctrl-C: one line that says where each rank was, no frames; the cluster keeps working
    cell = int(terminal.prompt.split("[")[1].split("]")[0])
    terminal.type(
        "%%allranks\nimport time\nx = torch.ones(1)\nif rank == 0:\n    dist.all_reduce(x)\n"
        "print('sleeping', rank, flush=True)\ntime.sleep(60)"
    )
    terminal.expect(r"\[rank 1\] sleeping 1")
    terminal.child.send("\x03")
    out = terminal.wait()
    assert f"KeyboardInterrupt: cell In[{cell}] interrupted: rank 0 waiting at all_reduce" in out
    assert f"; rank 1 at cell In[{cell}] line 7: time.sleep(60)" in out
    assert "Traceback" not in out and "distnb/" not in out and "sleeping" not in out
    assert len(out.strip().splitlines()) == 1, out
    assert "[rank 1] alive 1" in terminal.run("%%allranks\nprint('alive', rank)")

    # each rank's error once, with the rank's own traceback and none of distnb's frames
    terminal.type("%%allranks\nx = 1 / rank\nif rank == 1:\n    breakpoint()\nx = 2")
    terminal.expect(r"\[rank 1\] \(Pdb\) ")
    terminal.child.send("q\r")
    out = terminal.wait()
    assert len(re.findall(r"^\[rank 1\] DebuggerQuit: rank 1 quit the debugger", out, re.M)) == 1
    assert not re.search(r"^DebuggerQuit", out, re.M)
    assert len(re.findall(r"^\[rank 0\] ZeroDivisionError", out, re.M)) == 1
    assert out.count("Traceback (most recent call last)") == 1  # rank 0's own
    assert "distnb/" not in out and "site-packages" not in out

    # leaving IPython with ranks running: distnb's goodbye, not ipyparallel's repr
    terminal.child.send("exit\r")
    terminal.child.expect(pexpect.EOF)
    said = plain(terminal.child.before)
    assert "distnb: stopped 2 ranks and the controller" in said and "at exit" in said
    assert "Stopping cluster" not in said and "Cluster(" not in said


@pytest.fixture
def kernel() -> Iterator[Any]:
    with kernel_driver.kernel() as (_, kc):
        yield kc
        execute(kc, "%dist_stop")


def test_jupyter_kernel_progress_rank_widgets_and_auto_mode(kernel: Any) -> None:
    started = execute(kernel, "%load_ext distnb\n%dist_start -n 2")
    assert started.status == "ok", started.text
    bars = [m for m in started.messages if WIDGET in m.get("data", {})]
    assert bars, "start-up progress is a tqdm widget in Jupyter"

    ran = execute(
        kernel, "%%allranks\nfrom tqdm.auto import tqdm\nfor i in tqdm(range(3)):\n    pass"
    )
    assert ran.status == "ok"
    opened = ran.of_type("comm_open")
    assert len(opened) >= 2 and all(m["target_name"] == "jupyter.widget" for m in opened)

    assert "auto mode on: every cell runs on ranks 0-1" in execute(kernel, "%dist_auto on").text
    auto = execute(kernel, "y = rank + 1\nprint('auto', y)")
    assert auto.status == "ok"
    assert "[auto: ranks 0-1]" in auto.text
    assert "[rank 0] auto 1" in auto.text and "[rank 1] auto 2" in auto.text
    local = execute(kernel, "%%local\nprint('kernel has y:', 'y' in globals())")
    assert "kernel has y: False" in local.text
    failed = execute(kernel, "raise KeyError(rank)")
    assert failed.status == "error", failed.messages
    execute(kernel, "%dist_auto off")
    assert execute(kernel, "print('kernel', 40 + 2)").text.strip() == "kernel 42"
