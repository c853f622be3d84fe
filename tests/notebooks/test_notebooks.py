"""Every notebook in notebooks/, run top to bottom in a real Jupyter kernel.

Each notebook runs through nbclient in a fresh "python3" kernel (this environment's Python), or,
when its cells ask for input (a debugger's prompt), through a frontend that types the answers in
`ANSWERS` (nbclient cannot answer input requests). Only cells tagged `raises-exception` may
raise, and each of them must. `CHECKS` says what each notebook's key cells show; a new notebook
adds one line there. After the notebook, the kernel is
shut down and every process it started (ranks, controller, nannies, `!` commands and theirs) must
be gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import plain
from tests.kernel_driver import frontend

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
RAISES = "raises-exception"
CELL_TIMEOUT_S = 180  # per cell; starting ranks on a busy 2-core machine takes ~15 s
EXIT_WAIT_S = 10.0  # after the kernel's shutdown, for its processes to be gone

Selector = int | str  # a cell's index, or its id or one of its tags
Expected = str | tuple[str, ...]  # a substring, or substrings that appear in this order

# Per notebook: (cell, what its output must contain). A new notebook needs an entry here.
CHECKS: dict[str, list[tuple[Selector, Expected]]] = {
    "01-quickstart.ipynb": [
        ("start", ("rank", "backend", "\n0 ", "gloo", "\n1 ", "gloo")),
        (
            "all-reduce",
            (
                "[rank 0] before: [0.0, 1.0, 2.0]",
                "[rank 0] after:  [1.0, 3.0, 5.0]",
                "[rank 1] before: [1.0, 2.0, 3.0]",
                "[rank 1] after:  [1.0, 3.0, 5.0]",
            ),
        ),
        ("one-rank", "[rank 0] tensor([1., 3., 5.])"),
        ("status", ("\n0 ", "cpu", "gloo", "\n1 ", "cpu", "gloo")),
        ("shapes", ("Shapes on ranks 0-1", "batch", "[8, 16]", "[5, 16]", "model")),
        (
            "rank-error",
            (
                "[rank 0] loss computed",
                "RankError",
                "failed on rank 1",
                "[rank 1] ValueError: bad batch of shape (5, 16)",
            ),
        ),
        (
            "hang",
            ("RankTimeoutError", "[rank 0]", "dist.all_reduce(x)", "[rank 1]", "time.sleep(60)"),
        ),
        ("after-hang", "[ranks 0-1] [2.0, 6.0, 10.0]"),
    ],
    "02-shape-mismatch.ipynb": [
        ("plain", "[rank 1] [1, 2, 5] [0.0, 1.0, 2.0, 3.0, 4.0, 15.0, 16.0, 17.0, 18.0, 19.0]"),
        ("plain-abort", ("RankDiedError", "rank 0", "killed by SIGABRT", "%dist_restart")),
        (
            "checked",
            (
                "CollectiveMismatchError: shape mismatch in broadcast",
                "rank 0: broadcast(float32[1, 5], src=0)",
                "line 6: dist.broadcast(tensor, src=0)",
                "rank 1: broadcast(float32[1, 2, 5], src=0)",
                "line 6: dist.broadcast(tensor, src=0)",
                "Nothing was sent",
            ),
        ),
        ("after", ("[rank 0] all_reduce: 3.0", "[rank 1] all_reduce: 3.0")),
        ("fix", "[ranks 0-1] [1, 5] [0.0, 1.0, 2.0, 3.0, 4.0]"),
    ],
    "03-desync.ipynb": [
        (
            "early-stop",
            (
                "[rank 1] early stopping",
                "CollectiveDesyncError: rank 1 finished the cell without calling all_reduce #",
                "which rank 0 waits at cell In[",
                "] line 9",
            ),
        ),
        ("fix", ("[ranks 0-1] epoch ", ": early stopping on every rank")),
        (
            "skip",
            (
                "[rank 1] loss nan, acc 1.25",
                "CollectiveDesyncError",
                "rank 1 skipped all_reduce #",
                "] line 5 (rank 0 called it); rank 1's #",
                "] line 6",
            ),
        ),
        (
            "hang",
            (
                "RankTimeoutError",
                "[rank 0] running: waiting at all_reduce",
                "dist.all_reduce(acc)",
                "[rank 1] running",
                "time.sleep(60)",
            ),
        ),
        ("after-hang", "[ranks 0-1] [2.0, 2.0]"),
    ],
    "04-shapes-and-timelines.ipynb": [
        ("shapes", ("1 differ across ranks", "batch", "*[8, 16]", "*[8, 12]", "shape")),
        (
            "step",
            (
                "CollectiveDesyncError: rank 1 raised RuntimeError: mat1 and mat2 shapes",
                "which rank 0 waits at cell In[",
                "] line 4",
            ),
        ),
        ("fix", ("all agree across ranks", "batch", "[8, 16]", "[8, 16]")),
        (
            "timeline",
            (
                "wrote timeline.json",
                "Stragglers",
                "own wait\n  1 ",  # the first row: rank 1 held the others up most
                "Longest waits",
                "rank 1",
                "dist.all_reduce(x)",
            ),
        ),
        ("trace-file", ("timeline.json: ", " trace events")),
        ("cell-timeline", ("Collective timeline: ", "all_reduce  3 ")),
    ],
    "05-overflow.ipynb": [
        ("plain", ("[rank 0] step 3: loss nan", "[rank 1] step 2: loss nan")),
        (
            "report",
            (
                "rank 1 went non-finite first: step 2, 0.dropout (Dropout) forward input[0]",
                "rank 0 received it later",
                "step 3",
            ),
        ),
        ("train-stop", ("NonFiniteError", "rank 1: non-finite values at step 2, 0.dropout")),
        ("after-stop", "[ranks 0-1] weights finite: False"),
        ("report-fix", "No non-finite values on ranks 0-1."),
    ],
    "06-doctor.ipynb": [
        ("doctor", ("rank 0: host", "rank 1: host", "bus bandwidth", "GB/s", "\nOK")),
    ],
    "07-your-own-code.ipynb": [
        (
            "env",
            (
                "[rank 0] {'RANK': '0', 'LOCAL_RANK': '0', 'WORLD_SIZE': '2'",
                "[rank 0] same as the process group: True",
                "[rank 1] {'RANK': '1', 'LOCAL_RANK': '1', 'WORLD_SIZE': '2'",
                "[rank 1] same as the process group: True",
            ),
        ),
        (
            "accelerate",
            (
                "[rank 0] DistributedType.MULTI_CPU 0 2",
                "[rank 0] epoch 2: last loss of each rank [",
                "[rank 0] DistributedDataParallel with 8 batches on this rank",
                "[rank 1] DistributedType.MULTI_CPU 1 2",
                "[rank 1] DistributedDataParallel with 8 batches on this rank",
            ),
        ),
        ("torchrun-bug", ("train.py FAILED", "exitcode", "SIGABRT")),
        (
            "script-bug",
            (
                "CollectiveMismatchError: shape mismatch in all_reduce #",
                "rank 0: all_reduce(float32[], op=SUM)",
                "train.py:12: dist.all_reduce(loss)",
                "rank 1: all_reduce(float32[5], op=SUM) [DDP gradient bucket 0",
                "train.py:34: F.mse_loss(model(x), x @ w.T).backward()",
                "Nothing was sent",
            ),
        ),
        ("script-fix", ("[rank 0] epoch 0: val loss ", "[rank 0] epoch 2: val loss ")),
        ("torchrun-fix", ("epoch 0: val loss ", "epoch 2: val loss ")),
        ("after", "[ranks 0-1] True [2.0, 2.0]"),
    ],
    "08-step-into-a-rank.ipynb": [
        (
            "nan",
            ("[rank 0] step 2: loss", "[rank 0] step 3: loss nan", "[rank 1] step 2: loss nan"),
        ),
        (
            "stop",
            (
                "[rank 1] > cell In[",
                "-> loss.backward()",
                "(2, tensor(nan",
                "0.0000])",
                "distnb: rank 1 stopped at cell In[",
                "rank 0: waiting at all_reduce",
                "rank 1: stopped in the debugger",
                "rank 1 quit the debugger at cell In[",
            ),
        ),
        ("fix", ("[rank 1] step 2: loss", "[rank 1] step 3: loss")),
        ("crash", ("RankError", "failed on rank 1", "AssertionError: reading 5.0 out of range")),
        ("post-mortem", ("[rank 1] AssertionError", "[rank 1] tensor(5.)", "[rank 1] 2")),
        # without the visual debugger on (nbclient has none), the cell just runs
        ("visual", ("[rank 0] 0 tensor([", "[rank 1] 1 tensor([")),
    ],
    "09-replicas-drift.ipynb": [
        ("train", ("[rank 0] losses: [", "[rank 1] losses: [")),
        (
            "report",
            (
                "replicas of ddp first differ at step 4 (6 steps watched (1-6) on ranks 0-1): "
                "ddp.3.weight",
                "ddp.3.weight  0 | 1",
            ),
        ),
        ("diff", ("replicas differ: 1 of ", "on ranks 0-1", "ddp.3.weight  0 | 1", "[0, 8]")),
        ("fix-check", ("replicas agree: ", "compared on ranks 0-1")),
        (
            "buffers",
            ("replicas differ: 2 of ", "ddp.1.running_mean", "0 | 1", "ddp.1.running_var", "0 | 1"),
        ),
        (
            "sampler",
            (
                "identical where they should differ: 1 of 2 on ranks 0-1",
                "a DistributedSampler?",
                "batch  0,1",
            ),
        ),
    ],
}


# What a user types at the prompts of a notebook's cells, by cell id, as its text tells them to.
ANSWERS: dict[str, dict[str, list[str]]] = {
    "08-step-into-a-rank.ipynb": {
        "stop": ["p step, loss", "p x.std(0)", "p x[:3]", "ranks", "q"],
        "post-mortem": ["p peak", "u", "p step", "q"],
    },
}


def notebook_paths() -> list[Path]:
    return sorted(NOTEBOOKS.glob("*.ipynb"))


def test_every_notebook_has_checks_and_is_stored_clean() -> None:
    import nbformat

    names = [p.name for p in notebook_paths()]
    assert names, f"no notebooks in {NOTEBOOKS}"
    assert sorted(CHECKS) == names, "CHECKS must list exactly the notebooks in notebooks/"
    for path in notebook_paths():
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        assert nb.metadata["kernelspec"]["name"] == "python3", path.name
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, (
                    f"{path.name} cell {cell.get('id')}: store notebooks with outputs cleared"
                )
        for selector, _ in CHECKS[path.name]:
            assert cells_matching(nb, selector), f"{path.name}: no cell matches {selector!r}"


@pytest.mark.cluster
@pytest.mark.notebook
@pytest.mark.parametrize("path", notebook_paths(), ids=lambda p: p.stem)
def test_notebook_runs_in_a_kernel(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nbformat

    checks = CHECKS.get(path.name)
    assert checks is not None, f"add a line for {path.name} to CHECKS in {__file__}"
    # `!distnb ...` in a notebook needs this environment's scripts on the kernel's PATH.
    monkeypatch.setenv(
        "PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    )
    nb = nbformat.read(path, as_version=4)
    seen: dict[int, psutil.Process] = {}
    try:
        if path.name in ANSWERS:
            texts, raised = run_answering(nb, ANSWERS[path.name], tmp_path, seen)
        else:
            texts, raised = run_nbclient(nb, tmp_path, seen)
    finally:  # even when a cell failed: nothing may outlive the kernel
        left = still_running(seen.values(), EXIT_WAIT_S)
        kill(left)
    assert not left, f"still running after the kernel shut down: {describe(left)}"

    for index, cell in enumerate(nb.cells):
        if RAISES in cell.metadata.get("tags", []):
            where = f"cell {index} ({cell.get('id')})"
            assert raised[index], f"{where} is tagged {RAISES} but did not raise"
    for selector, expected in checks:
        text = "\n".join(texts[nb.cells.index(c)] for c in cells_matching(nb, selector))
        assert_contains(text, expected, f"{path.name} cell {selector!r}")


def run_nbclient(
    nb: Any, tmp_path: Path, seen: dict[int, psutil.Process]
) -> tuple[list[str], list[bool]]:
    """Run every cell with nbclient; each cell's text and whether it raised."""
    from nbclient import NotebookClient

    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=CELL_TIMEOUT_S,
        startup_timeout=60,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    with client.setup_kernel(), watch_descendants(client.km.provisioner.pid, seen):
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
    texts = [output_text(c) for c in nb.cells]
    return texts, [any(o.output_type == "error" for o in c.get("outputs", [])) for c in nb.cells]


def run_answering(
    nb: Any, answers: dict[str, list[str]], tmp_path: Path, seen: dict[int, psutil.Process]
) -> tuple[list[str], list[bool]]:
    """Run every cell through a frontend that types `answers` at the cells' prompts."""
    texts, raised = [], []
    with frontend(cwd=str(tmp_path)) as fe, watch_descendants(fe.km.provisioner.pid, seen):
        for cell in nb.cells:
            if cell.cell_type != "code":
                texts.append("")
                raised.append(False)
                continue
            reply = fe.run(cell.source, answers.get(cell.get("id"), []), timeout=CELL_TIMEOUT_S)
            texts.append(reply.text)
            raised.append(reply.status == "error")
        fe.km.shutdown_kernel(now=False)
    return texts, raised


def cells_matching(nb: Any, selector: Selector) -> list[Any]:
    if isinstance(selector, int):
        return [nb.cells[selector]] if -len(nb.cells) <= selector < len(nb.cells) else []
    return [
        c
        for c in nb.cells
        if c.get("id") == selector or selector in c.get("metadata", {}).get("tags", [])
    ]


def output_text(cell: Any) -> str:
    """Everything a cell shows as text: streams, plain-text data, errors with tracebacks."""
    parts = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type in ("display_data", "execute_result"):
            parts.append(str(out.data.get("text/plain", "")))
        elif out.output_type == "error":
            parts.append(f"{out.ename}: {out.evalue}\n" + "\n".join(out.traceback))
    return plain("\n".join(parts))


def assert_contains(text: str, expected: Expected, where: str) -> None:
    position = 0
    for part in (expected,) if isinstance(expected, str) else expected:
        found = text.find(part, position)
        assert found >= 0, f"{where}: expected {part!r} (in order: {expected!r}) in:\n{text}"
        position = found + len(part)


@contextlib.contextmanager
def watch_descendants(
    pid: int, seen: dict[int, psutil.Process], every_s: float = 0.1
) -> Iterator[None]:
    """Record `pid` and every descendant of it in `seen` while the block runs, every `every_s`.

    Sampling (not one look at the end) also catches processes that start and end inside one
    cell, such as the ranks of `!distnb doctor`, which would be invisible once orphaned.
    """
    stop = threading.Event()
    root = psutil.Process(pid)
    seen[pid] = root

    def sample() -> None:
        with contextlib.suppress(psutil.Error):
            for child in root.children(recursive=True):
                seen.setdefault(child.pid, child)

    def loop() -> None:
        while not stop.wait(every_s):
            sample()

    thread = threading.Thread(target=loop, name="watch-descendants", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        sample()


def running(proc: psutil.Process) -> bool:
    """Alive and not a zombie (a zombie has exited; it only waits for its parent to reap it)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def still_running(procs: Any, timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if running(p)]
    return alive


def kill(procs: list[psutil.Process]) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGKILL)


def describe(procs: list[psutil.Process]) -> str:
    out = []
    for proc in procs:
        try:
            out.append(f"{proc.pid} {' '.join(proc.cmdline())[:100]}")
        except psutil.Error:
            out.append(str(proc.pid))
    return "; ".join(out)
