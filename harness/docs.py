"""The documented examples, run: every ```python block of the README and the guide's pages that
is followed at once by a bare ``` block (what it prints) is an example. A page's examples run in
order in one fresh interpreter, in a real IPython shell (no colours, as a notebook's text shows
them), and what each prints is compared with what the page shows.

    python -m harness.docs                 # run every page's examples; exit 1 naming each drift
    python -m harness.docs docs/guide/x.md # one page
    python -m harness.docs --write PAGE    # put what prints in place of what a drifted block shows

A page's examples follow `%load_ext distnb` and `%dist_start -n 2` (cell In[1]) unless one of
them loads distnb itself. Run folders of jobs the examples start go to the examples' folder.
`...` in a shown output stands for what differs by machine or run (pids, hosts, ports, times),
as in doctest, and runs of spaces compare equal (tables realign with a wider pid). At a
debugger's prompt the shell reads what the shown output has typed there (`(Pdb) p x`), a moment
later as a person would, then `c`. Lines of the start's progress bar are left out: a notebook
shows them as one bar that the table replaces. `--write` writes what printed, ellipses gone: put
them back where the output is the machine's.

Used by tests/docs/test_examples.py.
"""

from __future__ import annotations

import doctest
import itertools
import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the user guide: architecture.md and performance.md are the project's own records (the latter's
# outputs are held by bench/check.py)
PAGES = (
    ROOT / "README.md",
    ROOT / "docs" / "index.md",
    *sorted((ROOT / "docs" / "guide").glob("*.md")),
)
FENCE = re.compile(r"^```(\w*)\s*$")
_TYPED = re.compile(r"^(?:\[ranks? (?:[\d,-]+|\.\.\.)\] )?\((?:Pdb|ipdb)\) (.+)$", re.MULTILINE)
_PROGRESS = re.compile(r"^distnb: .*\d+/\d+ \[\d\d:\d\d(:\d\d)?\]$")
_CHECKER = doctest.OutputChecker()
_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
SETUP = "%load_ext distnb\n%dist_start -n 2"  # what a page's examples follow, unless they start
EXAMPLE_TIMEOUT_S = 600  # a page's examples, together: a start is ~15 s on a busy machine


@dataclass(frozen=True)
class Example:
    """A ```python block (`code`, starting at `line`) and the bare block after it (`shown`,
    its lines `shown_at` to `shown_end` of the page, 0-based, fences excluded)."""

    page: Path
    line: int
    code: str
    shown: str
    shown_at: int
    shown_end: int

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line + 1}"

    def typed(self) -> list[str]:
        """What the user types at the debugger's prompts the output shows."""
        return [m[1] for m in _TYPED.finditer(self.shown)]


def examples(page: Path) -> list[Example]:
    """The examples on `page`, in order (see the module); fences may be indented (in a list)."""
    lines = page.read_text().splitlines()
    blocks: list[tuple[str, int, int]] = []  # (language, first line inside, line of the end)
    i = 0
    while i < len(lines):
        opened = FENCE.match(lines[i].strip())
        if opened is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        blocks.append((opened[1], i + 1, end))
        i = end + 1
    found = []
    for (lang, start, end), (then, at, stop) in itertools.pairwise(blocks):
        if lang == "python" and then == "" and at == end + 2:  # the output's fence follows
            code = textwrap.dedent("\n".join(lines[start:end]))
            shown = textwrap.dedent("\n".join(lines[at:stop]))
            found.append(Example(page, start - 1, code, shown, at, stop))
    return found


def agrees(shown: str, printed: str) -> bool:
    """Whether `printed` is what `shown` shows (see the module)."""
    return _CHECKER.check_output(shown.strip() + "\n", printed.strip() + "\n", _FLAGS)


# Runs in the fresh interpreter: each example's code as a cell, what it printed on one stream;
# a debugger's prompt reads the example's typed lines (echoed, as a terminal shows them), then
# `c` once they are all used
_RUNNER = """
import builtins, contextlib, io, json, re, sys, time
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config
config = Config()
config.HistoryManager.enabled = False  # run by hand too: the user's IPython history stays as it was
shell = InteractiveShell.instance(config=config, colors="NoColor")
answers = []
def typed(prompt=""):
    time.sleep(0.3)  # a person reads the prompt before typing: peers that stop too are there
    line = answers.pop(0) if answers else "c"
    print(prompt + line)
    return line
builtins.input = typed
printed = []
for code, typed_lines in json.loads(sys.stdin.read()):
    answers[:] = typed_lines
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        shell.run_cell(code, store_history=True)
    printed.append(out.getvalue())
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    shell.run_cell("%dist_stop")
print(json.dumps(printed))
"""


def run(page_examples: list[Example], cwd: Path) -> list[str]:
    """What each example printed, its progress lines and `Out[N]:` prompts left out; run in
    `cwd` (the examples may write files). A page whose first example starts no session has its
    examples follow `SETUP` (cell In[1], its output not shown)."""
    cells = [(e.code, e.typed()) for e in page_examples]
    setup = "%load_ext distnb" not in "\n".join(c for c, _ in cells)
    done = subprocess.run(
        [sys.executable, "-c", _RUNNER],
        input=json.dumps([(SETUP, []), *cells] if setup else cells),
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=EXAMPLE_TIMEOUT_S,
        env={**os.environ, "COLUMNS": "200", "DISTNB_RUNS": str(cwd / "runs")},
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the examples' interpreter failed:\n{done.stdout}\n{done.stderr}")
    last = done.stdout.strip().splitlines()[-1]
    return [_as_shown(p) for p in json.loads(last)][1 if setup else 0 :]


def _as_shown(printed: str) -> str:
    kept = []
    for line in printed.splitlines():
        if _PROGRESS.match(line.strip()):
            continue
        line = re.sub(r"^Out\[\d+\]: ?", "", line)
        kept.append(line.rstrip())
    return textwrap.dedent("\n".join(kept)).strip("\n")


def drifts(page: Path, cwd: Path) -> list[tuple[Example, str]]:
    """The examples on `page` whose output is not what the page shows, with what printed."""
    found = examples(page)
    if not found:
        return []
    return [(e, p) for e, p in zip(found, run(found, cwd), strict=True) if not agrees(e.shown, p)]


def write(page: Path, drifted: list[tuple[Example, str]]) -> None:
    """Put what printed in place of each drifted block's shown output."""
    lines = page.read_text().splitlines()
    for example, printed in sorted(drifted, key=lambda d: -d[0].shown_at):
        fence = lines[example.shown_at - 1]
        indent = fence[: len(fence) - len(fence.lstrip())]
        new = [indent + line if line else line for line in printed.splitlines()]
        lines[example.shown_at : example.shown_end] = new
    page.write_text("\n".join(lines) + "\n")


def main(argv: list[str]) -> int:
    import tempfile

    rewrite = "--write" in argv
    pages = [Path(a).resolve() for a in argv if a != "--write"] or list(PAGES)
    bad = 0
    for page in pages:
        with tempfile.TemporaryDirectory(prefix="distnb-docs-") as cwd:
            drifted = drifts(page, Path(cwd))
        for example, printed in drifted:
            bad += 1
            print(f"{example.where()}: shows\n{example.shown}\nprints\n{printed}\n")
        if rewrite and drifted:
            write(page, drifted)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
