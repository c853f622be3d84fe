"""The notebooks in notebooks/ and how to run one in a real kernel: what each one's key cells
must show (`CHECKS`), what a user types at its prompts (`ANSWERS`), and the runners (nbclient,
or a frontend that answers input requests). Used by tests/notebooks and tests/binder.

Only cells tagged `raises-exception` may raise, and each of them must. A new notebook adds one
line to `CHECKS`.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from harness.kernel_driver import frontend
from harness.processes import plain, watch_descendants

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


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
                "[rank 1] before: [1.0, 2.0, 3.0]",
                "[ranks 0-1] after:  [1.0, 3.0, 5.0]",  # the same line on both: once
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
                "stopped in a debugger\n  1 ",  # the first row: rank 1 held the others up most
                "Longest waits",
                "rank 1",
                "dist.all_reduce(x)",
            ),
        ),
        ("trace-file", ("timeline.json: ", " trace events")),
        ("cell-timeline", ("Collective timeline: ", "all_reduce  3 ")),
    ],
    "05-overflow.ipynb": [
        (
            "plain",
            (
                "[rank 0] step 2: loss 0.",
                "[rank 1] step 2: loss nan",
                "[ranks 0-1] step 3: loss nan",
            ),
        ),
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
                "[rank 1] {'RANK': '1', 'LOCAL_RANK': '1', 'WORLD_SIZE': '2'",
                "[ranks 0-1] same as the process group: True",
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
            (
                "[rank 0] step 2: loss 4",
                "[rank 1] step 2: loss nan",
                "[ranks 0-1] step 3: loss nan",
            ),
        ),
        (
            "stop",
            (
                "[rank 1] > cell In[",
                "-> loss.backward()",
                "distnb: rank 1 stopped at cell In[",  # before the answers: in order
                "(2, tensor(nan",
                "0.0000])",
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
    "10-attach-to-a-job.ipynb": [
        ("start", "running, pid"),
        (
            "attach",
            (
                "(2 ranks, launcher pid",
                "\n0 ",
                "in collective  20",
                "in all_reduce #40 on WORLD",
                "train.py:10",
                "\n1 ",
                "running        20",
                "after all_reduce #39 on WORLD",
                "train.py:32",
                "verdict: rank 1 runs at ",
                "train.py:32 (time.sleep(0.1)) without calling all_reduce #40 on WORLD, which "
                "rank 0 waits at ",
                "train.py:10",
                "rank 0:",
                "in evaluate",
                "dist.all_reduce(loss)",
                "rank 1:",
                "time.sleep(0.1)",
            ),
        ),
        (
            "stop",
            (
                "distnb: detached; the job goes on as it would have",
                "launcher exit status: 1",
                "run folder says ended: True",
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


@contextmanager
def own_tmp() -> Iterator[dict[str, str]]:
    """A kernel's environment with a temporary folder of its own, removed after it: the log
    folders (`torchelastic_*`) torchrun keeps there for a job a notebook starts go with it."""
    with tempfile.TemporaryDirectory(prefix="distnb-nb-") as folder:
        yield {**os.environ, "TMPDIR": folder}


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
    with (
        own_tmp() as env,
        client.setup_kernel(env=env),
        watch_descendants(client.km.provisioner.pid, seen),
    ):
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
    texts = [output_text(c) for c in nb.cells]
    return texts, [any(o.output_type == "error" for o in c.get("outputs", [])) for c in nb.cells]


def run_answering(
    nb: Any, answers: dict[str, list[str]], tmp_path: Path, seen: dict[int, psutil.Process]
) -> tuple[list[str], list[bool]]:
    """Run every cell through a frontend that types `answers` at the cells' prompts."""
    texts, raised = [], []
    with (
        own_tmp() as env,
        frontend(str(tmp_path), env) as fe,
        watch_descendants(fe.km.provisioner.pid, seen),
    ):
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
