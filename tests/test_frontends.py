"""distnb as users meet it: terminal IPython in a real pseudo-terminal, and a real Jupyter kernel.

Start-up progress (tqdm: text in a terminal, a widget in Jupyter), tqdm bars and widgets made on
the ranks (text in a terminal, without breaking ipyparallel's output dispatch; relayed widgets in
Jupyter), and auto mode (the prompt, `%%local`, off again).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import kernel_driver
from tests.conftest import plain
from tests.kernel_driver import execute

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
            env={**os.environ, "IPYTHONDIR": str(ipython_dir)},
            encoding="utf-8",
            timeout=180,
            dimensions=(50, 200),
        )
        self.prompt = self._wait()

    def run(self, cell: str) -> str:
        # The simple prompt reads line by line: a cell magic ends at its second blank line.
        blank = "\r\r" if cell.startswith("%%") else ""
        self.child.send(cell.replace("\n", "\r") + "\r" + blank)
        return self._wait()

    def _wait(self) -> str:
        self.child.expect(PROMPT)
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
