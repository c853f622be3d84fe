"""The debugger on the ranks from terminal IPython, typed at its prompt under a pty."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.cluster

pexpect = pytest.importorskip("pexpect")


@pytest.fixture
def ipython() -> Iterator[Any]:
    command = str(Path(sys.executable).with_name("ipython"))
    child = pexpect.spawn(
        command,
        ["--simple-prompt", "--colors=nocolor", "--no-banner", "--HistoryManager.enabled=False"],
        encoding="utf-8",
        timeout=120,
        dimensions=(50, 200),
    )
    child.expect(r"In \[1\]: ")
    yield child
    if child.isalive():
        child.sendline("%dist_stop")
        child.expect("stopped 2 ranks and the controller")
        child.sendline("exit")
        child.expect(pexpect.EOF)
    child.close(force=True)


def test_breakpoint_prompts_in_the_terminal(ipython: Any) -> None:
    ipython.sendline("%load_ext distnb")
    ipython.expect(r"In \[2\]: ")
    ipython.sendline("%dist_start -n 2")
    ipython.expect(r"In \[3\]: ")
    # a cell magic at IPython's simple prompt ends with an empty line
    cell = ["%%allranks", "x = rank + 40", "if rank == 1:", "    breakpoint()", "y = x + 1"]
    for line in [*cell, "", ""]:
        ipython.sendline(line)
    # what the rank printed before its prompt is on the screen, labelled, before the prompt
    ipython.expect(r"\[rank 1\] > cell In\[3\] line 5, in <module>\(\)")
    ipython.expect(r"\[rank 1\] \(Pdb\) ")
    ipython.sendline("p x")
    ipython.expect(r"\[rank 1\] 41\r?\n")
    ipython.expect(r"\[rank 1\] \(Pdb\) ")
    ipython.sendline("c")
    ipython.expect(r"In \[4\]: ")
    ipython.sendline("%%allranks --timeout 30")
    ipython.sendline("print('next', rank)")
    ipython.sendline("")
    ipython.sendline("")
    ipython.expect(r"\[rank 1\] next 1")
