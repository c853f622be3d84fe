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
        child.expect(r"stopped ranks 0-1 on \S+ and the controller")
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


def start_two_ranks(ipython: Any) -> None:
    ipython.sendline("%load_ext distnb")
    ipython.expect(r"In \[2\]: ")
    ipython.sendline("%dist_start -n 2")
    ipython.expect(r"In \[3\]: ")


def test_commands_to_both_ranks_switching_stepping_and_interact(ipython: Any) -> None:
    start_two_ranks(ipython)
    cell = [
        "%%allranks",
        "x = torch.ones(2) * (rank + 1)",
        "breakpoint()",
        "print('a', rank)",
        "y = 1",
    ]
    for line in [*cell, "", ""]:
        ipython.sendline(line)
    ipython.expect(r"\[rank 0\] \(Pdb\) ")
    # one command to every stopped rank, the answers labelled by rank
    ipython.sendline("ranks all p x")
    ipython.expect(r"\[rank 0\] tensor\(\[1\., 1\.\]\)\r?\n\[rank 1\] tensor\(\[2\., 2\.\]\)")
    ipython.expect(r"\[rank 0\] \(Pdb\) ")
    # switching says where the other rank stands
    ipython.sendline("rank 1")
    ipython.expect(r"distnb: rank 1 stopped at cell In\[3\] line 4")
    ipython.expect(r"\[rank 1\] \(Pdb\) ")
    # s on a print goes to the cell's next line, not into distnb's engine
    ipython.sendline("s")
    ipython.expect(r"\[rank 1\] > cell In\[3\] line 5, in <module>\(\)")
    assert "engine.py" not in ipython.before
    ipython.expect(r"\[rank 1\] \(Pdb\) ")
    # interact echoes an expression's value, at once
    ipython.sendline("interact")
    ipython.expect(r"\[rank 1\] >>> ")
    ipython.sendline("x * 10")
    ipython.expect(r"\[rank 1\] tensor\(\[20\., 20\.\]\)")
    ipython.expect(r"\[rank 1\] >>> ")
    ipython.sendline("exit()")
    ipython.expect(r"\[rank 1\] \(Pdb\) ")
    ipython.sendline("ranks all c")
    ipython.expect(r"distnb: ranks 0-1 go on \(c\)")
    ipython.expect(r"In \[4\]: ")
    assert "PYDEV" not in ipython.before
