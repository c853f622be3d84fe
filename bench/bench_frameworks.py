"""Each framework script of `harness/frameworks.py` under torchrun and under distnb: the verdict
each gives and what it costs, as a table.

    python bench/bench_frameworks.py [--rounds 3] [--hang 60] [--pause 0.5] [NAME ...]

torchrun: each script once under `torchrun --standalone --nproc-per-node 2` (a fresh process per
rank: imports, rendezvous, exit), its verdict read as `harness.frameworks` records it ("pass",
"hangs" past `--hang` seconds, or the exception rank 0 ended with) and its wall time; a hung run
is killed with its workers. distnb: one warm 2-rank session (this process plays the kernel);
per round, each script once with `%dist_run` and once as a `%%allranks` cell, in an order that
rotates from round to round, each `--pause` seconds after the last one's answer (a user reading
it: a rank frees the modules a run took out while it waits, `distnb.rank.fresh.modules`). The
first `%dist_run` of the session is reported apart (it imports what every run keeps); the rows
give the median and the range over the rounds. A run re-imports
the frameworks a script uses (a torchrun worker's fresh modules, `distnb.rank.fresh`); a cell
imports them once, as a notebook does. Exits 1 where a verdict differs from the table's.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from results import saved

import distnb
from harness.frameworks import CASES, Case, write_scripts

GLOO_WORDS = ("Connection closed by peer", "Connection reset by peer")
GLOO_LOST = "rank 0 fails: gloo lost its peer"


def torchrun_verdict(script: Path, hang: float) -> tuple[str, float]:
    """(verdict, seconds) of `script` under torchrun; "hangs" past `hang` seconds."""
    command = [str(Path(sys.executable).parent / "torchrun"), "--standalone"]
    command += ["--nproc-per-node", "2", str(script)]
    started = time.perf_counter()
    process = subprocess.Popen(
        command,
        cwd=script.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = process.communicate(timeout=hang)
    except subprocess.TimeoutExpired:
        # torchrun starts each worker in a session of its own: end them by name, then it
        workers = psutil.Process(process.pid).children(recursive=True)
        for p in [*workers, psutil.Process(process.pid)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        process.communicate()
        return "hangs", time.perf_counter() - started
    took = time.perf_counter() - started
    if process.returncode == 0:
        return "pass", took
    if any(words in out for words in GLOO_WORDS):  # which of the two varies from run to run
        return GLOO_LOST, took
    last = [line for line in out.splitlines() if "Error" in line][-1:]
    return f"fails: {last[0][:100] if last else out[-200:]}", took


def first_line(error: BaseException | None) -> str:
    return str(error).splitlines()[0] if error is not None else ""


class Runs:
    """One warm session; each run's verdict (the error's first line) and wall time."""

    def __init__(self, folder: Path, pause: float) -> None:
        self.folder, self.pause = folder, pause
        self.s = distnb.start(2, progress=False)
        # what the scripts write (a checkpoint, the Trainer's folder) goes to `folder`: a run
        # works in the kernel's folder, a cell in its rank's
        os.chdir(folder)
        self.s.run(f"import os\nos.chdir({str(folder)!r})")

    def script(self, name: str) -> tuple[str, float]:
        return self._timed(lambda: self.s.run_script(str(self.folder / name)))

    def cell(self, name: str) -> tuple[str, float]:
        return self._timed(lambda: self.s.run(CASES[name].source))

    def _timed(self, run: object) -> tuple[str, float]:
        error = None
        time.sleep(self.pause)
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                run()  # type: ignore[operator]
            except Exception as exc:  # the verdict: distnb's error
                error = exc
        took = time.perf_counter() - started
        return first_line(error).replace(f"{self.folder}/", ""), took


def same_verdict(case: Case, said: str, cell: bool) -> bool:
    """distnb's verdict is the table's; in a cell, collectives count on from the cells before
    and the sites are the cell's, so the kind, the ranks and the calls are compared."""
    if not cell:
        return said == case.distnb
    return _calls(said) == _calls(case.distnb)


def _calls(line: str) -> str:
    line = re.sub(r"#\d+", "#N", line)
    line = re.sub(r"the script \S+ ", "the cell ", line)
    return line.split(", which", 1)[0]


def spread(times: list[float]) -> str:
    return f"{statistics.median(times):.2f} s ({min(times):.2f}-{max(times):.2f})"


def measure(names: list[str], rounds: int, hang: float, pause: float) -> int:
    differ = 0
    back = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="bench-frameworks-") as folder:
        write_scripts(Path(folder))
        theirs = {}
        for name in names:
            theirs[name] = torchrun_verdict(Path(folder) / name, hang)
            print(f"torchrun {name}: {theirs[name][0]} ({theirs[name][1]:.1f} s)", flush=True)
        runs = Runs(Path(folder), pause)
        try:
            first = runs.script(names[0])
            scripts: dict[str, list[float]] = {n: [] for n in names}
            cells: dict[str, list[float]] = {n: [] for n in names}
            verdicts: dict[tuple[str, str], str] = {}
            for r in range(rounds):
                order = names[r % len(names) :] + names[: r % len(names)]
                for name in order:
                    for mode, times, run in (
                        ("script", scripts, runs.script),
                        ("cell", cells, runs.cell),
                    ):
                        said, took = run(name)
                        times[name].append(took)
                        before = verdicts.setdefault((name, mode), said)
                        if _calls(before) != _calls(said):
                            print(f"{name} as a {mode}: {said!r}, before {verdicts[name, mode]!r}")
                            differ += 1
        finally:
            runs.s.stop()
            os.chdir(back)
    print(f"\nfirst %dist_run of the session ({names[0]}): {first[1]:.2f} s")
    print(f"{rounds} rounds, {pause:g} s between runs; distnb's times: median (range)\n")
    print("| framework | script | torchrun | time | distnb, %dist_run | time | cell | time |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        case = CASES[name]
        verdict, took = theirs[name]
        ours = verdicts[name, "script"]
        in_cell = verdicts[name, "cell"]
        bad = [
            what
            for what, ok in (
                ("torchrun", verdict == case.torchrun),
                ("%dist_run", same_verdict(case, ours, cell=False)),
                ("cell", same_verdict(case, in_cell, cell=True)),
            )
            if not ok
        ]
        differ += len(bad)
        cell = "the same" if same_verdict(case, in_cell, cell=True) else in_cell
        print(
            f"| {case.framework} | {case.mistake or 'right'} ({name}) | {verdict} | {took:.1f} s "
            f"| {ours or 'passes'} | {spread(scripts[name])} | {cell} | {spread(cells[name])} |"
        )
        for what in bad:
            print(f"  {name} differs from the table ({what})")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hang", type=float, default=60.0)
    parser.add_argument("--pause", type=float, default=0.5)
    parser.add_argument("names", nargs="*", default=list(CASES))
    args = parser.parse_args()
    with saved("frameworks"):
        return measure(args.names, args.rounds, args.hang, args.pause)


if __name__ == "__main__":
    sys.exit(main())
