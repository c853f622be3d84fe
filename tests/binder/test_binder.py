"""notebooks/ on Binder: built as Binder builds binder/, run within Binder's limits.

Binder (repo2docker) makes an image from binder/: the Python that runtime.txt names, then
`pip install --no-cache-dir -r binder/requirements.txt`, the repository copied in, and
`binder/postBuild`; each session starts through `binder/start` (which ends in `exec "$@"`), and
everything in it shares about 1 CPU and 2 GiB. This test does the same here: a fresh venv,
requirements.txt, a copy of the repository (its tracked and unignored files), postBuild; then a
"python3" kernelspec whose kernel joins a cgroup of 1 CPU and 2 GiB (`limits.py`) and execs
`binder/start`, and every notebook in notebooks/ runs through it with the checks and prompt
answers of tests/notebooks/test_notebooks.py. No process may outlive its notebook, none may be
killed by the OOM killer.

Where it differs from Binder, on purpose:
- torch and every other package are pinned as on this project's machines (`constraints.txt`:
  torch's CPU build, the releases the suite passed with), and requirements.txt's
  `--extra-index-url` for PyTorch's CPU wheels is left out: here pip has that build on disk, and
  any other torch request downloads gigabytes (Binder gets its CPU torch from that index);
- repo2docker's base environment (Jupyter, ipykernel) comes from requirements.txt's `jupyterlab`;
- nbclient talks to the kernel directly, so no Jupyter server shares the cgroup's memory.

Measured on this project's 2-core machine: the build ~50 s, notebooks 01-08 ~130 s and 09 ~35 s
(07, with torchrun beside the ranks, peaks at 1.4 GiB of the 2), the venv's removal ~3 s: ~4 min
in all, longer with other test runs on the machine. Part of `make test`; `-m "not binder"` leaves
it out. `DISTNB_BINDER_VENV=DIR` builds the environment in DIR once and reuses it while binder/ and
constraints.txt stay the same (for work on the notebooks).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from harness.notebooks import (
    ANSWERS,
    CHECKS,
    EXIT_WAIT_S,
    RAISES,
    assert_contains,
    cells_matching,
    notebook_paths,
    run_answering,
    run_nbclient,
)
from harness.processes import describe, kill, still_running
from tests.binder.limits import Limits, Unavailable, sweep

REPO = Path(__file__).resolve().parents[2]
BINDER = REPO / "binder"
PYTORCH_INDEX = re.compile(r"^\s*--extra-index-url\s+https://download\.pytorch\.org/\S*\s*$")
PIP_TIMEOUT_S = 1200
PREFIX = "distnb-binder-"  # then the pid of the test run, for its cgroup and its folder


@dataclass
class Binder:
    repo: Path  # the copy the image holds
    venv: Path
    limits: Limits
    jupyter_path: Path  # holds the "python3" kernelspec


def test_requirements_list_distnbs_dependencies_and_its_torch_floor() -> None:
    """postBuild installs distnb with --no-deps: requirements.txt must list what it needs."""
    import tomllib

    wanted = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    listed = [
        line.strip()
        for line in (BINDER / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith(("#", "-"))
    ]
    names = {re.split(r"[<>=!~ \[;]", req, maxsplit=1)[0].lower(): req for req in listed}
    for req in wanted:
        name = re.split(r"[<>=!~ \[;]", req, maxsplit=1)[0].lower()
        assert name in names, f"binder/requirements.txt lacks {req} (pyproject.toml)"
    assert names["torch"] == next(r for r in wanted if r.startswith("torch"))


# --- the environment, as repo2docker builds it ----------------------------------------------


@pytest.fixture(scope="module")
def binder() -> Iterator[Binder]:
    runtime = (BINDER / "runtime.txt").read_text().strip()
    if runtime != "python-{}.{}".format(*sys.version_info[:2]):
        pytest.skip(f"binder/runtime.txt asks for {runtime}; this is Python {sys.version[:4]}")
    sweep_leftovers()
    try:
        limits = Limits(f"{PREFIX}{os.getpid()}")
    except Unavailable as exc:
        pytest.skip(str(exc))
    work = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
    try:
        repo = copy_repository(work / "repo")
        venv = build(repo, work)
        jupyter_path = work / "share"
        kernelspec(jupyter_path / "kernels" / "python3", repo, venv, limits)
        yield Binder(repo, venv, limits, jupyter_path)
    finally:
        limits.close()
        shutil.rmtree(work, ignore_errors=True)


def sweep_leftovers() -> None:
    """What a test run killed before its teardown left: its empty cgroups, its folder (a venv
    of ~1.5 GB). Processes left in its cgroup stay: they are not this run's."""
    sweep(PREFIX)
    for folder in Path(tempfile.gettempdir()).glob(f"{PREFIX}*-*"):
        pid = folder.name[len(PREFIX) :].split("-")[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def copy_repository(to: Path) -> Path:
    """The repository's files as repo2docker copies them: tracked and untracked, not ignored."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():  # a file deleted in the work tree is still listed
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name)
    return to


def build(repo: Path, work: Path) -> Path:
    """A venv with requirements.txt, then postBuild (or the reusable one DISTNB_BINDER_VENV
    names, when it was built from these files)."""
    kept = os.environ.get("DISTNB_BINDER_VENV")
    venv = Path(kept) if kept else work / "venv"
    stamp = venv / "distnb-binder-stamp"
    digest = fingerprint(repo)
    if kept and stamp.exists() and stamp.read_text() == digest:
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys._base_executable, "-m", "venv", str(venv)], check=True)
    requirements = work / "requirements.txt"
    requirements.write_text(
        "".join(
            line
            for line in (repo / "binder" / "requirements.txt").read_text().splitlines(True)
            if not PYTORCH_INDEX.match(line)
        )
    )
    # --no-compile: Python compiles what the notebooks import when they import it; the rest
    # (~30,000 files of bytecode) would only slow the build and the folder's removal
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--no-cache-dir", "--no-compile"]
    run([*pip, "-r", str(requirements), "-c", str(repo / "constraints.txt")], venv, cwd=repo)
    run([str(repo / "binder" / "postBuild")], venv, cwd=repo)
    stamp.write_text(digest)
    return venv


def fingerprint(repo: Path) -> str:
    parts = [repo / "constraints.txt", *sorted((repo / "binder").iterdir())]
    return hashlib.sha256(b"".join(p.read_bytes() for p in parts)).hexdigest()


def run(command: list[str], venv: Path, cwd: Path) -> None:
    """Run a build step in the venv's environment; fail with its output."""
    done = subprocess.run(
        command,
        cwd=cwd,
        env=venv_env(venv),
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
    )
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}"


def venv_env(venv: Path) -> dict[str, str]:
    """This process's environment, with the venv's Python first and this one's gone; no
    OMP_NUM_THREADS, which binder/start must set."""
    ours = str(Path(sys.executable).parent)
    path = [str(venv / "bin"), *(p for p in os.environ["PATH"].split(os.pathsep) if p != ours)]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "PYTHONPATH")}
    return {**env, "PATH": os.pathsep.join(path), "VIRTUAL_ENV": str(venv)}


def kernelspec(folder: Path, repo: Path, venv: Path, limits: Limits) -> None:
    """A "python3" kernel that joins the cgroup, then starts as Binder starts: `binder/start`."""
    folder.mkdir(parents=True)
    join = limits.join_script(folder / "join-and-start", [str(repo / "binder" / "start")])
    python = str(venv / "bin" / "python")
    spec = {
        "argv": [str(join), python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (Binder)",
        "language": "python",
        "env": {"PATH": venv_env(venv)["PATH"], "VIRTUAL_ENV": str(venv)},
    }
    (folder / "kernel.json").write_text(json.dumps(spec, indent=1))


# --- every notebook ---------------------------------------------------------------------------


@pytest.mark.binder
@pytest.mark.cluster
@pytest.mark.notebook
@pytest.mark.parametrize("path", notebook_paths(), ids=lambda p: p.stem)
def test_notebook_runs_on_binder(
    binder: Binder, path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nbformat

    # "python3" is now the Binder kernel, for nbclient and for the frontend that answers prompts
    monkeypatch.setenv("JUPYTER_PATH", str(binder.jupyter_path))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # binder/start's to set
    nb = nbformat.read(binder.repo / "notebooks" / path.name, as_version=4)
    workdir = binder.repo / "notebooks"
    oom_kills = binder.limits.oom_kills()
    binder.limits.reset_peak()
    seen: dict[int, psutil.Process] = {}
    started = time.monotonic()
    try:
        if path.name in ANSWERS:
            texts, raised = run_answering(nb, ANSWERS[path.name], workdir, seen)
        else:
            texts, raised = run_nbclient(nb, workdir, seen)
    finally:
        left = still_running(seen.values(), EXIT_WAIT_S)
        kill(left)
    took = time.monotonic() - started
    peak = binder.limits.peak()
    print(f"binder: {path.name} in {took:.0f} s, peak memory {gib(peak)}")
    # the kernel and its ranks ran in the cgroup, that is through the Binder kernelspec
    assert peak is None or peak > 256 * 2**20, f"{path.name}: peak {gib(peak)} in the cgroup"
    assert binder.limits.oom_kills() == oom_kills, (
        f"{path.name}: the OOM killer killed a process (peak {gib(peak)} of 2 GiB)"
    )
    assert not left, f"still running after the kernel shut down: {describe(left)}"
    assert binder.limits.pids() == [], "processes left in the cgroup"

    for index, cell in enumerate(nb.cells):
        if RAISES in cell.metadata.get("tags", []):
            assert raised[index], (
                f"cell {index} ({cell.get('id')}) is tagged {RAISES}, but showed:\n{texts[index]}"
            )
    for selector, expected in CHECKS[path.name]:
        text = "\n".join(texts[nb.cells.index(c)] for c in cells_matching(nb, selector))
        assert_contains(text, expected, f"{path.name} cell {selector!r} on Binder")


def gib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / 2**30:.2f} GiB"
