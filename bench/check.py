"""Re-derive the figures the README, the guide (docs/guide/) and docs/performance.md quote from the
benches' saved output.

    python bench/check.py           # fails, naming the place and the figure, on any drift
    python bench/check.py --write   # first copy each saved output into its quoted block

Run by `make lint` (and `make bench-check`); it reads `bench/results/`, it never runs a bench.
Two checks:

1. **Quoted outputs are the saved ones.** In docs/performance.md, a line
   `<!-- output: bench/results/NAME.txt -->` stands before a fenced block that must hold that
   file verbatim (`--write` puts it there after a rerun).
2. **Every figure in the prose comes from an output.** A figure is a decimal number with a unit
   (`1.40x`, `0.26 s`, `5.61 ms`, `16.1 us`, `4.6%`), a range of two (`1.34-1.61x`) or an
   interval (`[1.30-1.47]`). Each must be, rounded as the prose rounds it, a number printed in
   the outputs its paragraph draws on: in docs/performance.md, those quoted in its section; in
   either file, those of every bench the paragraph names (`bench/bench_faults.py` ->
   `bench/results/faults*.txt`). A figure right after "target" is a goal, not checked. A
   paragraph (a list item, a table row) holding `<!-- elsewhere -->`, or right after it on a
   line of its own, quotes figures from outside the benches and says where they come from in
   its text; it is not checked. A paragraph of the README or the guide that names no bench
   makes no claim from one and is not checked either.
"""

from __future__ import annotations

import itertools
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
GUIDE = sorted((ROOT / "docs" / "guide").glob("*.md"))
PERFORMANCE = ROOT / "docs" / "performance.md"
DOCS = (ROOT / "README.md", *GUIDE, PERFORMANCE)
OUTPUT = re.compile(r"^<!-- output: (bench/results/[\w.-]+\.txt) -->$")
BENCH = re.compile(r"bench/bench_(\w+)\.py")
NUMBER = r"\d+\.\d+"
FIGURE = re.compile(
    rf"(?<![\w.\[-])({NUMBER})(?:\s?-\s?({NUMBER}))?\s?(x|ms|s|µs|us|%|GB|MB|MiB)(?![\w-])"
)
INTERVAL = re.compile(rf"\[({NUMBER})-({NUMBER})\]")
ELSEWHERE = "<!-- elsewhere -->"
SCALES = (1.0, 1e3, 1e-3)  # a figure in ms may quote an output in s, and the other way


@dataclass(frozen=True)
class Unit:
    """A paragraph, list item or table row: where it starts and the outputs it draws on."""

    doc: Path
    line: int
    text: str
    sources: tuple[Path, ...]


def main(argv: list[str]) -> int:
    if "--write" in argv:
        write_blocks(PERFORMANCE)
    problems = check_blocks(PERFORMANCE)
    for doc in DOCS:
        for unit in units(doc):
            problems += check_unit(unit)
    for p in problems:
        print(p)
    print(f"bench/check.py: {len(problems)} figure(s) that the saved outputs do not give")
    return 1 if problems else 0


def blocks(text: str) -> list[tuple[int, Path, int, int]]:
    """(marker line, results file, first and last line of the fenced block after it)."""
    lines = text.split("\n")
    found = []
    for i, line in enumerate(lines):
        m = OUTPUT.match(line)
        if m is None:
            continue
        start = i + 1
        if start >= len(lines) or not lines[start].startswith("```"):
            raise SystemExit(f"{i + 1}: an output marker must stand right before a ``` block")
        end = next(j for j in range(start + 1, len(lines)) if lines[j].startswith("```"))
        found.append((i + 1, ROOT / m.group(1), start + 1, end))
    return found


def write_blocks(doc: Path) -> None:
    lines = doc.read_text().split("\n")
    for _, path, first, last in reversed(blocks("\n".join(lines))):
        if path.exists():
            lines[first:last] = path.read_text().rstrip("\n").split("\n")
    doc.write_text("\n".join(lines))


def check_blocks(doc: Path) -> list[str]:
    lines = doc.read_text().split("\n")
    problems = []
    for marker, path, first, last in blocks("\n".join(lines)):
        where = f"{doc.relative_to(ROOT)}:{marker}"
        if not path.exists():
            problems.append(f"{where}: {path.relative_to(ROOT)} is not there")
        elif "\n".join(lines[first:last]) != path.read_text().rstrip("\n"):
            problems.append(
                f"{where}: the block differs from {path.relative_to(ROOT)} "
                "(python bench/check.py --write copies it)"
            )
    return problems


def units(doc: Path) -> list[Unit]:
    """The doc's prose in units, each with its sources (code blocks left out)."""
    lines = doc.read_text().split("\n")
    marked = {path for _, path, _, _ in blocks("\n".join(lines))}
    sections = _sections(lines) if doc.name == "performance.md" else {}
    found: list[Unit] = []
    start, text, fenced = 0, [], False
    for i, line in enumerate([*lines, ""]):
        if line.startswith("```"):
            fenced = not fenced
            continue
        marker = line.strip() == ELSEWHERE
        new = not line.strip() or line.startswith(("- ", "|", "#")) or fenced or marker
        if new and text and text != [ELSEWHERE]:  # the marker on its own line: the next unit's
            found.append(_unit(doc, start, text, sections.get(start, ()), marked))
            text = []
        if not fenced and line.strip() and not line.startswith("#"):
            if not text:
                start = i + 1
            text.append(line)
    return found


def _sections(lines: list[str]) -> dict[int, tuple[Path, ...]]:
    """Line number -> the outputs quoted in the section (between two headings) it is in."""
    owner: dict[int, tuple[Path, ...]] = {}
    fenced, heads = False, []
    for i, line in enumerate(lines):
        fenced ^= line.startswith("```")
        if line.startswith("#") and not fenced:
            heads.append(i)
    heads.append(len(lines))
    for a, b in itertools.pairwise(heads):
        quoted = tuple(ROOT / m.group(1) for line in lines[a:b] if (m := OUTPUT.match(line)))
        owner.update({n + 1: quoted for n in range(a, b)})
    return owner


def _unit(
    doc: Path, start: int, text: list[str], section: tuple[Path, ...], marked: set[Path]
) -> Unit:
    joined = " ".join(text)
    named = [  # bench_agent_call.py writes agent-call.txt
        path
        for m in BENCH.finditer(joined)
        for stem in sorted({m[1], m[1].replace("_", "-")})
        for path in sorted(RESULTS.glob(f"{stem}*.txt"))
    ]
    if doc.name != "performance.md" and not named:
        return Unit(doc, start, "", ())  # names no bench: claims nothing from one
    return Unit(doc, start, joined, tuple(dict.fromkeys([*section, *named])))


def check_unit(unit: Unit) -> list[str]:
    if not unit.text or ELSEWHERE in unit.text:
        return []
    text = unit.text
    figures = [(m[0], [m[1], m[2]]) for m in FIGURE.finditer(text) if not _target(text, m)]
    figures += [(m[0], [m[1], m[2]]) for m in INTERVAL.finditer(text)]
    figures = [(quoted, [v for v in values if v]) for quoted, values in figures]
    if not figures:
        return []
    where = f"{unit.doc.relative_to(ROOT)}:{unit.line}"
    if not unit.sources:
        return [f"{where}: {figures[0][0]} and the rest: no bench output quoted here or named"]
    printed = _numbers(unit.sources)
    names = ", ".join(str(p.relative_to(ROOT)) for p in unit.sources)
    return [
        f"{where}: {quoted}: {value} is not printed in {names} (the figure drifted, or comes "
        f"from elsewhere: say where and mark the paragraph {ELSEWHERE})"
        for quoted, values in figures
        for value in values
        if not _given(value, printed)
    ]


def _target(text: str, match: re.Match[str]) -> bool:
    """A figure right after "target" is a goal, not a measurement: `(target 1.05x)`."""
    return text[max(0, match.start() - 8) : match.start()].rstrip(" :").endswith("target")


def _numbers(paths: tuple[Path, ...]) -> list[float]:
    return [float(n) for p in paths if p.exists() for n in re.findall(r"\d+\.\d+", p.read_text())]


def _given(value: str, printed: list[float]) -> bool:
    """Whether a printed number, rounded as `value` is, gives it (in the same unit or scaled
    by a thousand)."""
    places = len(value.split(".")[1])
    return any(f"{n * k:.{places}f}" == value for n in printed for k in SCALES)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
