"""Memory of a notebook's processes: kernel + controller + ranks + their nannies.

    python bench/bench_memory.py [NOTEBOOK] [--target-gb 1.0]

Runs NOTEBOOK (default: the newest of notebooks/01-*.ipynb .. 04-*.ipynb that exists) cell by
cell in a real "python3" kernel, the way Jupyter does, and just before the cell that stops the
cluster (`%dist_stop`; else after the last cell) measures every process in the kernel's tree:

- RSS: resident pages, shared ones included, so a sum over processes counts torch's shared
  libraries once per process and overstates the total;
- PSS: each shared page divided among the processes mapping it; sums to what the tree really
  occupies, and is the figure held against the target;
- USS: pages no other process maps; what stopping that one process would give back.

PSS and USS come from psutil's `memory_full_info()` (Linux `/proc/PID/smaps_rollup`). The target,
1.0 GB of PSS by default, is docs/architecture.md's budget for a kernel with torch, a threaded
controller and two CPU ranks; it is also what keeps the quick start inside Binder's 2 GB limit.
Exit status 1 when the total misses the target.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
STOP = re.compile(r"^\s*%dist_stop\b", re.MULTILINE)
RAISES = "raises-exception"
MB = 1 << 20
RANK_PIDS = (
    "import json; from distnb.magics import DistMagics\n"
    "_m = next(m for m in get_ipython().magics_manager.registry.values()"
    " if isinstance(m, DistMagics))\n"
    "print(json.dumps({r.pid: r.rank for r in _m.session.ranks}))"
)


@dataclass(frozen=True, slots=True)
class Row:
    pid: int
    role: str
    rss: int
    pss: int | None
    uss: int | None


def default_notebook() -> Path:
    found = [p for n in range(1, 5) for p in sorted(NOTEBOOKS.glob(f"{n:02d}-*.ipynb"))]
    if not found:
        sys.exit(f"no notebook 01-*.ipynb .. 04-*.ipynb in {NOTEBOOKS}")
    return found[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebook", nargs="?", type=Path, help="default: newest of 01..04")
    parser.add_argument("--target-gb", type=float, default=1.0, help="PSS budget, GB (2**30)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per cell")
    args = parser.parse_args(argv)
    notebook = (args.notebook or default_notebook()).resolve()
    python = Path(sys.executable)
    shown = python.relative_to(REPO) if python.is_relative_to(REPO) else python
    print("command:", " ".join([str(shown), *sys.argv]))
    print(f"notebook: {notebook.relative_to(REPO) if notebook.is_relative_to(REPO) else notebook}")
    print(environment())
    rows = measure(notebook, args.timeout)
    print(table(rows))
    total = sum(r.pss for r in rows if r.pss is not None) / (1 << 30)
    met = total <= args.target_gb
    print(
        f"target: PSS total {total:.2f} GB <= {args.target_gb:.1f} GB: {'met' if met else 'MISSED'}"
    )
    return 0 if met else 1


def environment() -> str:
    import torch

    knobs = {k: os.environ.get(k, "-") for k in ("OMP_NUM_THREADS", "MALLOC_ARENA_MAX")}
    return (
        f"python {platform.python_version()}, torch {torch.__version__}, "
        f"{os.cpu_count()} cores, {psutil.virtual_memory().total / (1 << 30):.1f} GB RAM, "
        + ", ".join(f"{k}={v}" for k, v in knobs.items())
    )


def measure(notebook: Path, timeout: float) -> list[Row]:
    """Run the notebook's cells up to its stop cell, measure, then run the rest."""
    from jupyter_client.manager import start_new_kernel

    cells = [c for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]
    sources = ["".join(c["source"]) for c in cells]
    stop_at = next((i for i, s in enumerate(sources) if STOP.search(s)), len(cells))
    # the user's IPython history is theirs: the bench's cells stay out of it
    km, kc = start_new_kernel(
        kernel_name="python3",
        cwd=str(notebook.parent),
        extra_arguments=["--HistoryManager.enabled=False"],
    )
    try:
        for cell, source in zip(cells[:stop_at], sources[:stop_at]):
            run(kc, source, RAISES in cell.get("metadata", {}).get("tags", []), timeout)
        started = time.perf_counter()
        rows = measure_tree(km.provisioner.pid, rank_pids(kc, timeout))
        print(f"measured {len(rows)} processes in {time.perf_counter() - started:.2f} s")
        for cell, source in zip(cells[stop_at:], sources[stop_at:]):
            run(kc, source, RAISES in cell.get("metadata", {}).get("tags", []), timeout)
        return rows
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)


def run(kc: Any, source: str, may_raise: bool, timeout: float) -> str:
    """Execute one cell; return its stdout. A cell not tagged `raises-exception` must not raise."""
    stdout: list[str] = []

    def keep_stdout(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            stdout.append(msg["content"]["text"])

    reply = kc.execute_interactive(
        source, timeout=timeout, output_hook=keep_stdout, stop_on_error=not may_raise
    )
    content = reply["content"]
    if content["status"] == "error" and not may_raise:
        raise RuntimeError(f"cell raised {content['ename']}: {content['evalue']}\n{source}")
    return "".join(stdout)


def rank_pids(kc: Any, timeout: float) -> dict[int, int]:
    text = run(kc, RANK_PIDS, False, timeout).strip().splitlines()
    return {int(pid): rank for pid, rank in json.loads(text[-1]).items()} if text else {}


def measure_tree(kernel_pid: int, ranks: dict[int, int]) -> list[Row]:
    kernel = psutil.Process(kernel_pid)
    rows = []
    for proc in [kernel, *kernel.children(recursive=True)]:
        try:
            with proc.oneshot():
                role = role_of(proc, kernel_pid, ranks)
                rss = proc.memory_info().rss
                try:
                    full = proc.memory_full_info()
                    pss, uss = getattr(full, "pss", None), full.uss
                except psutil.AccessDenied:
                    pss = uss = None
        except psutil.NoSuchProcess:
            continue
        rows.append(Row(proc.pid, role, rss, pss, uss))
    return rows


def role_of(proc: psutil.Process, kernel_pid: int, ranks: dict[int, int]) -> str:
    if proc.pid == kernel_pid:
        return "kernel"
    if proc.pid in ranks:
        return f"rank {ranks[proc.pid]} (engine)"
    cmd = proc.cmdline()
    module = cmd[cmd.index("-m") + 1] if "-m" in cmd[:-1] else proc.name()
    if module == "ipyparallel.engine.nanny":  # started by the engine it watches
        parent = proc.ppid()
        return f"nanny of rank {ranks[parent]}" if parent in ranks else "nanny"
    if module == "ipyparallel.controller":
        return "controller" if proc.ppid() == kernel_pid else "controller (its child)"
    return module


def table(rows: list[Row]) -> str:
    def mb(v: int | None) -> str:
        return f"{v / MB:8.1f}" if v is not None else "       -"

    lines = [f"{'pid':>7}  {'process':<24} {'RSS MB':>8} {'PSS MB':>8} {'USS MB':>8}"]
    for r in sorted(rows, key=lambda r: (r.role != "kernel", r.role)):
        lines.append(f"{r.pid:>7}  {r.role:<24} {mb(r.rss)} {mb(r.pss)} {mb(r.uss)}")

    def total(attr: str) -> int | None:
        values = [getattr(r, attr) for r in rows]
        return None if any(v is None for v in values) else sum(values)

    lines.append(f"{'':>7}  {'total':<24} {mb(total('rss'))} {mb(total('pss'))} {mb(total('uss'))}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from results import saved

    with saved("memory"):
        code = main()
    sys.exit(code)
