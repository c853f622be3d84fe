"""A script's imports made ahead while the ranks wait (`distnb.rank.ahead`), on a real 2-rank
gloo cluster: the next run of the script starts after them and sees what a torchrun worker
sees; what changed since, or what only a run may do, makes the run import them itself."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from harness.processes import NAMED_S

if TYPE_CHECKING:
    from distnb.session import Session

pytestmark = pytest.mark.cluster

# A module beside the script, as Lightning's import does: it notes each import (when, and the
# argv it saw) in a file per rank, prints, sets a variable, wraps torch.compile, and registers
# an atexit handler.
HELPER = """\
import atexit, functools, os, sys, time, torch

NOTES = os.path.join(os.path.dirname(__file__), "notes")  # not on sys.path: its files change
with open(os.path.join(NOTES, "imports" + os.environ["RANK"]), "a") as f:
    f.write(f"{time.time()} {sys.argv[1:]}\\n")
print("helper imported with", sys.argv[1:])
os.environ["SET_BY_HELPER"] = "1"
_compile = torch.compile


@functools.wraps(_compile)
def compile(*args, **kwargs):
    return _compile(*args, **kwargs)


compile.depth = getattr(_compile, "depth", 0) + 1
torch.compile = compile
atexit.register(print, "helper exits")
VALUE = 1
"""
SCRIPT = """\
import os, time, torch
import helper

print("run sees", helper.VALUE, torch.compile.depth, os.environ["SET_BY_HELPER"])
with open(os.path.join(helper.NOTES, "ended" + os.environ["RANK"]), "w") as f:
    f.write(str(time.time()))
"""


def imports(folder: Path, count: int) -> list[list[tuple[float, str]]]:
    """Each rank's imports of the helper (time, argv), once each rank has made `count`."""
    files = [folder / "notes" / f"imports{rank}" for rank in (0, 1)]
    deadline = time.monotonic() + NAMED_S
    while True:
        made = [f.read_text().splitlines() if f.exists() else [] for f in files]
        if all(len(lines) >= count for lines in made):
            break
        assert time.monotonic() < deadline, f"the ranks imported the helper {made}"
        time.sleep(0.05)
    return [[(float(line.split()[0]), line.partition(" ")[2]) for line in lines] for lines in made]


@pytest.fixture
def script(tmp_path: Path) -> Path:
    (tmp_path / "notes").mkdir()
    (tmp_path / "helper.py").write_text(HELPER)
    (tmp_path / "script.py").write_text(SCRIPT)
    return tmp_path / "script.py"


def test_a_script_run_again_starts_after_imports_made_while_the_ranks_waited(
    session: Session, script: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for _ in range(2):  # a script run again is made ahead from then on
        session.run_script(str(script), "a")
    imports(script.parent, 3)  # the two runs', and one made once the second had replied
    cells = session.run(
        "import os, sys\n"
        "print('helper' in sys.modules, hasattr(torch.compile, 'depth'),\n"
        "      'SET_BY_HELPER' in os.environ)"
    )
    assert cells.stdout(0) == cells.stdout(1) == "False False False\n"  # the cells see none of it
    script.write_text(SCRIPT.replace("run sees", "edited, sees"))  # its imports unchanged
    capsys.readouterr()
    sent = time.time()
    session.run_script(str(script), "a")
    out = capsys.readouterr().out
    # what the import printed, the variable it set, its one wrapper, its atexit handler: as a
    # torchrun worker's run of the script shows them
    assert "[ranks 0-1] helper imported with ['a']\n[ranks 0-1] edited, sees 1 1 1\n" in out, out
    assert out.count("helper exits") == 1, out
    for rank, made in enumerate(imports(script.parent, 4)):
        assert made[2][0] < sent  # made before the run was sent
        ended = float((script.parent / "notes" / f"ended{rank}").read_text())
        assert made[3][0] > ended  # and the run imported nothing: the next is made after it


def test_what_the_imports_saw_changing_makes_the_run_import_them_itself(
    session: Session, script: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for _ in range(2):
        session.run_script(str(script), "a")
    imports(script.parent, 3)
    capsys.readouterr()
    session.run_script(str(script), "b")  # other arguments: made for 'a', imported for 'b'
    out = capsys.readouterr().out
    assert "[ranks 0-1] helper imported with ['b']\n[ranks 0-1] run sees 1 1 1\n" in out, out
    assert out.count("helper exits") == 1, out  # what was made for 'a' ended unseen
    session.run_script(str(script), "b")
    imports(script.parent, 6)  # 'b' made ahead
    (script.parent / "helper.py").write_text(HELPER.replace("VALUE = 1", "VALUE = 22"))
    session.run_script(str(script), "b")  # an edited helper
    assert "[ranks 0-1] run sees 22 1 1\n" in capsys.readouterr().out


def test_imports_that_make_a_collective_are_left_to_the_run(
    session: Session, tmp_path: Path
) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "helper.py").write_text(
        "import os, torch.distributed as dist\n"
        "notes = os.path.join(os.path.dirname(__file__), 'notes')\n"
        "with open(os.path.join(notes, 'imports' + os.environ['RANK']), 'a') as f:\n"
        "    f.write('0 import\\n')\n"
        "dist.barrier()  # every rank's import meets its peers'\n"
    )
    (tmp_path / "script.py").write_text("import helper\n")
    for _ in range(2):
        session.run_script(str(tmp_path / "script.py"))
    imports(tmp_path, 3)  # the runs' imports, and one tried once the second had replied
    waiting = session.run("import distnb.rank.ahead as ahead\nahead._ready is None")
    assert waiting.result(0) == waiting.result(1) == "True"  # its barrier refused it
    session.run_script(str(tmp_path / "script.py"))
    assert [e.op for e in session.timeline(cells=1).events if e.rank == 0] == ["barrier"]
