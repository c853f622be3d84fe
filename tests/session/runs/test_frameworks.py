"""Lightning's, Fabric's and Ignite's scripts under `%dist_run` on a real 2-rank gloo cluster,
as a user writes them, against the same scripts under a real `torchrun`.

A run must be a torchrun worker to every probe frameworks use to tell a notebook from a script
(Lightning refuses `strategy="ddp"` in a notebook), and give the cells their notebook back.
"""

from __future__ import annotations

import re
import sys
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from distnb.errors import CollectiveDesyncError, CollectiveMismatchError
from harness.frameworks import CASES, write_scripts
from harness.processes import NAMED_S
from tests.session.runs.test_scripts import rank_lines, torchrun_output

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from distnb.session import Session

pytestmark = pytest.mark.cluster

# The probes of the standard library and IPython (cheap: the check tier runs them) ...
PROBES = """
import builtins, sys
import IPython
shell = IPython.get_ipython()
print("sys.ps1", hasattr(sys, "ps1"), "sys.ps2", hasattr(sys, "ps2"))
print("builtins", [n for n in ("get_ipython", "__IPYTHON__", "display") if n in vars(builtins)])
print("IPython.get_ipython()", None if shell is None else "shell")
print("exit", type(exit).__module__, "quit", type(quit).__module__)
print("sys.flags.interactive", sys.flags.interactive)
print("__main__ has __file__", hasattr(sys.modules["__main__"], "__file__"))
"""
# ... and the libraries' own (each imports its library afresh in a run)
LIBRARY_PROBES = """
import lightning.fabric.utilities.imports as lightning
import rich.console
import tqdm.auto
from transformers.utils import is_in_notebook
print("lightning _IS_INTERACTIVE", lightning._IS_INTERACTIVE)
print("tqdm.auto", tqdm.auto.tqdm.__module__)
print("rich is_jupyter", rich.console.Console().is_jupyter)
print("transformers is_in_notebook", is_in_notebook())
"""
# What a torchrun worker's probes print (test_probes_see_what_they_see_under_torchrun checks it)
WORKER = [
    "sys.ps1 False sys.ps2 False",
    "builtins []",
    "IPython.get_ipython() None",
    "exit _sitebuiltins quit _sitebuiltins",
    "sys.flags.interactive 0",
    "__main__ has __file__ True",
]
WORKER_LIBRARIES = [
    "lightning _IS_INTERACTIVE False",
    "tqdm.auto tqdm.asyncio",
    "rich is_jupyter False",
    "transformers is_in_notebook False",
]

SCRIPTS = {"probes.py": PROBES, "library_probes.py": PROBES + LIBRARY_PROBES}


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = write_scripts(tmp_path_factory.mktemp("frameworks"))
    for name, text in SCRIPTS.items():
        (folder / name).write_text(textwrap.dedent(text).lstrip())
    return folder


@pytest.fixture
def torchrun() -> Path:
    found = Path(sys.executable).parent / "torchrun"
    if not found.exists():
        pytest.skip("no torchrun next to this Python")
    return found


@pytest.mark.check
def test_a_run_is_a_torchrun_worker_to_every_probe_and_the_cells_are_a_notebook(
    session: Session, shell: InteractiveShell, scripts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.run_line_magic("dist_run", str(scripts / "probes.py"))
    out = capsys.readouterr().out
    for rank in (0, 1):
        assert rank_lines(out, rank) == WORKER, out
    cell = session.run(PROBES)
    for rank in (0, 1):
        assert cell.stdout(rank).splitlines() == [
            "sys.ps1 False sys.ps2 False",  # a rank is no console: Lightning runs in cells
            "builtins ['get_ipython', '__IPYTHON__', 'display']",
            "IPython.get_ipython() shell",
            "exit IPython.core.autocall quit IPython.core.autocall",
            "sys.flags.interactive 0",
            "__main__ has __file__ False",
        ], cell.stdout(rank)


def test_probes_see_what_they_see_under_torchrun(
    session: Session,
    shell: InteractiveShell,
    scripts: Path,
    torchrun: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # a cell imported the libraries first: a run imports them afresh, as a worker does
    session.run(LIBRARY_PROBES)
    capsys.readouterr()
    shell.run_line_magic("dist_run", str(scripts / "library_probes.py"))
    ours = capsys.readouterr().out
    theirs = torchrun_output(torchrun, tmp_path, str(scripts / "library_probes.py"))
    for rank in (0, 1):
        assert theirs[rank].splitlines() == WORKER + WORKER_LIBRARIES
        assert rank_lines(ours, rank) == WORKER + WORKER_LIBRARIES, ours
    after = session.run(LIBRARY_PROBES)
    assert after.stdout(0).splitlines() == [
        "lightning _IS_INTERACTIVE False",
        "tqdm.auto tqdm.asyncio",  # an engine is no ipykernel app: no widget bars
        "rich is_jupyter True",
        "transformers is_in_notebook True",
    ], after.stdout(0)


def test_lightning_fits_as_under_torchrun_and_its_classic_hang_is_named(
    shell: InteractiveShell,
    scripts: Path,
    torchrun: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    expected = torchrun_output(torchrun, tmp_path, str(scripts / "lightning_fit.py"))
    finals = [[ln for ln in text.splitlines() if ln.startswith("rank ")] for text in expected]
    assert finals[0][0].startswith("rank 0 of 2 loss ")
    capsys.readouterr()
    for _ in range(2):  # twice in one session, the same
        shell.run_line_magic("dist_run", str(scripts / "lightning_fit.py"))
        out = capsys.readouterr().out
        for rank in (0, 1):
            assert [ln for ln in rank_lines(out, rank) if ln.startswith("rank ")] == finals[rank]
    # self.log(sync_dist=True) on rank 0 only: torchrun waits for good, distnb names it
    started = time.monotonic()
    with pytest.raises(CollectiveMismatchError) as caught:
        shell.run_line_magic("dist_run", str(scripts / "lightning_log_on_rank0.py"))
    assert time.monotonic() - started < NAMED_S
    said = str(caught.value)
    line = 'lightning_log_on_rank0.py:15: self.log("loss", loss, sync_dist=True)'
    assert line in said, said
    # each call in the framework's words: the barrier self.log makes, and DDP's bucket
    assert said.splitlines()[0] == CASES["lightning_log_on_rank0.py"].distnb, said
    assert "barrier() [Lightning self.log(sync_dist=True)]" in said, said
    # the session goes on: the same fit again
    shell.run_line_magic("dist_run", str(scripts / "lightning_fit.py"))
    out = capsys.readouterr().out
    assert [ln for ln in rank_lines(out, 1) if ln.startswith("rank ")] == finals[1], out


def test_ignite_trains_as_under_torchrun_again_and_again(
    shell: InteractiveShell,
    scripts: Path,
    torchrun: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    expected = torchrun_output(torchrun, tmp_path, str(scripts / "ignite_fit.py"))
    finals = [[ln for ln in text.splitlines() if ln.startswith("rank ")] for text in expected]
    assert finals[0] and finals[0][0].startswith("rank 0 loss "), expected
    capsys.readouterr()
    for _ in range(2):  # idist.Parallel ends the process group each time; distnb makes it again
        shell.run_line_magic("dist_run", str(scripts / "ignite_fit.py"))
        out = capsys.readouterr().out
        for rank in (0, 1):
            assert [ln for ln in rank_lines(out, rank) if ln.startswith("rank ")] == finals[rank]
    shell.run_line_magic("dist_run", str(scripts / "ignite_fit.py"))  # the session goes on
    out = capsys.readouterr().out
    assert [ln for ln in rank_lines(out, 1) if ln.startswith("rank ")] == finals[1], out


def test_every_framework_script_gets_the_tables_verdict_as_a_script_and_as_a_cell(
    session: Session, shell: InteractiveShell, scripts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each case of `harness.frameworks`, as a script and as a cell, in mixed order in one
    session: the right ones pass, each mistake is named as the table says, within NAMED_S."""
    session.run(f"import os\nhere = os.getcwd()\nos.chdir({str(scripts)!r})")  # their files
    try:
        for i, (name, case) in enumerate(CASES.items()):
            modes = ("script", "cell") if i % 2 else ("cell", "script")
            for mode in modes:
                started = time.monotonic()
                said = ""
                try:
                    if mode == "script":
                        with pytest.MonkeyPatch.context() as patch:
                            patch.chdir(scripts)
                            shell.run_line_magic("dist_run", str(scripts / name))
                    else:
                        session.run(case.source)
                except (CollectiveMismatchError, CollectiveDesyncError) as exc:
                    said = str(exc).splitlines()[0].replace(f"{scripts}/", "")
                took = time.monotonic() - started
                out = capsys.readouterr().out
                if case.passes:
                    assert not said and "rank 1 " in out, f"{name} as a {mode}: {said}\n{out}"
                    continue
                assert took < NAMED_S, f"{name} as a {mode}: {took:.1f} s"
                if mode == "script":
                    assert said == case.distnb, f"{name}: {said}"
                else:  # collectives count on from the cells before; sites are the cell's
                    assert calls(said) == calls(case.distnb), f"{name} as a cell: {said}"
    finally:
        session.run("os.chdir(here)")


def calls(line: str) -> str:
    """A verdict's first line less what differs between a cell and a script: sequence numbers
    (a cell's count on from the cells before), the script's name, the waiter's site."""
    line = re.sub(r"#\d+", "#N", line)
    line = re.sub(r"the script \S+ ", "the cell ", line)
    return line.split(", which", 1)[0]


def test_lightning_and_fabric_run_in_cells_on_the_sessions_ranks(
    session: Session, shell: InteractiveShell, scripts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.run_line_magic("dist_run", str(scripts / "lightning_fit.py"))
    out = capsys.readouterr().out
    finals = [[ln for ln in rank_lines(out, r) if ln.startswith("rank ")] for r in (0, 1)]
    assert finals[0] and finals[0][0].startswith("rank 0 of 2 loss "), out
    fit = (
        "import psutil\nbefore = {c.pid for c in psutil.Process().children(recursive=True)}\n"
        + CASES["lightning_fit.py"].source
        + "after = {c.pid for c in psutil.Process().children(recursive=True)}\n"
        + "print('new processes', len(after - before))\n"
    )
    for _ in range(2):  # a cell's Trainer is the session's ranks, again and again: no forks
        cell = session.run(fit)
        for rank in (0, 1):
            lines = cell.stdout(rank).splitlines()
            assert [ln for ln in lines if ln.startswith("rank ")] == finals[rank]
            assert lines[-1] == "new processes 0", lines
    fabric = session.run(
        "from lightning.fabric import Fabric\n"
        "fabric = Fabric(accelerator='cpu', strategy='ddp', devices=2)\n"
        "fabric.launch()\n"
        "fabric.all_reduce(torch.ones(3) * (fabric.global_rank + 1), reduce_op='sum').tolist()"
    )
    assert fabric.result(0) == fabric.result(1) == "[3.0, 3.0, 3.0]"
