"""JupyterLab served and driven in a real Chromium, for the browser tests.

JupyterLab serves a temporary folder holding copies of notebooks/ (127.0.0.1, a free port, a
token, its own settings and workspace); Debian's Chromium, driven by Playwright, opens a notebook
(`page`). The helpers run cells as a user does and read what the page shows. The fixtures
(`chromium`, `lab`, `page`) reach the browser tests through tests/browser/conftest.py.

Skipped when Chromium, Playwright or JupyterLab is missing. Playwright cannot download its own
browser here, so it launches the system one (`DISTNB_CHROMIUM`, default /usr/bin/chromium).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from harness.processes import kill, remove_kernel_files, still_running, watch_descendants

REPO = Path(__file__).resolve().parents[1]


NOTEBOOKS = REPO / "notebooks"


ARTIFACTS = REPO / "artifacts" / "browser"
# Screenshots of the debugger tests and the frontend's debug requests, kept for a failure
SHOTS = REPO / "artifacts" / "debug"


NOTEBOOK = "01-quickstart.ipynb"


TIMELINES = "04-shapes-and-timelines.ipynb"


DEBUGGER = "08-step-into-a-rank.ipynb"


CHROMIUM = Path(os.environ.get("DISTNB_CHROMIUM", "/usr/bin/chromium"))


# "Named rather than hanging" for what a page waits for (a render, a prompt, a cell's output):
# Chromium, JupyterLab, the kernel and its ranks share 2 cores, beside other test runs.
WAIT_MS = 90_000
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


SERVER_START_S = 60.0


RUN_ALL_S = 180.0  # the whole notebook; about 25 s on an idle 2-core machine


# Kernel idle this long while the last cell has not run: the run stopped. Not shorter: the status
# bar (and the server's execution state) can read "Idle" while a cell that updates widgets runs,
# as `%dist_start` does for 3-7 s (seen with JupyterLab 4.6 and ipykernel 7.4).
STALLED_S = 30.0


EXIT_WAIT_S = 10.0


# What a widget that failed to render looks like: the manager's error, or a model's repr.
BROKEN_WIDGET = ("Error displaying widget", "VBox(children=", "Tab(children=", "IntProgress(")


@dataclass
class Lab:
    url: str
    token: str
    process: subprocess.Popen[bytes]
    root: Path  # the folder it serves: the notebooks' working directory
    seen: dict[int, psutil.Process] = field(default_factory=dict)


@pytest.fixture
def chromium() -> str:
    pytest.importorskip("playwright.sync_api", reason="needs Playwright: pip install playwright")
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium, or set DISTNB_CHROMIUM")
    return str(CHROMIUM)


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    pytest.importorskip("jupyterlab", reason="needs JupyterLab: pip install jupyterlab")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    root = tmp_path / "root"
    root.mkdir()
    for path in NOTEBOOKS.glob("*.ipynb"):
        (root / path.name).write_bytes(path.read_bytes())
    token = secrets.token_hex(16)
    port = free_port()
    with open(ARTIFACTS / "jupyterlab.log", "wb") as log:
        process = subprocess.Popen(
            lab_command(tmp_path, root, port, token),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=lab_env(tmp_path),
            cwd=root,
            start_new_session=True,  # its own process group, to kill it whole if it hangs
        )
        server = Lab(f"http://127.0.0.1:{port}", token, process, root)
        try:
            with watch_descendants(process.pid, server.seen):
                wait_until_serving(server)
                yield server
        finally:
            stop_server(server)
            left = still_running(server.seen.values(), EXIT_WAIT_S)
            kill(left)
            remove_kernel_files(server.seen)
    assert not left, f"still running after JupyterLab stopped: {[p.pid for p in left]}"


@pytest.fixture
def page(chromium: str) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium, args=CHROMIUM_ARGS, timeout=WAIT_MS
        )
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(WAIT_MS)
            yield page
        finally:
            browser.close()


def open_prompt(page: Any, area: Any) -> Any:
    """The input box of the prompt open in `area`, as one element (a locator would find the box
    again at each action). While an answer is taken and the rank's output area redrawn,
    JupyterLab briefly shows the answered box beside the next one: wait until one box has stood
    alone for a moment."""
    fields = area.locator("input.jp-Stdin-input")
    deadline, alone = time.monotonic() + RUN_ALL_S, 0
    while alone < 3:
        assert time.monotonic() < deadline, f"no prompt opened: {output_text(area)}"
        alone = alone + 1 if fields.count() == 1 else 0
        page.wait_for_timeout(100)
    return fields.last.element_handle()


def answer_prompt(page: Any, area: Any, answer: str) -> None:
    """Type `answer` into the prompt open in `area` and press Enter, into the one box that holds
    it: a box redrawn between the typing and the key (a loaded machine) is found and typed into
    again, never sent empty."""
    from playwright.sync_api import Error

    for _ in range(5):
        field = open_prompt(page, area)
        try:
            field.fill(answer, timeout=5_000)
            if field.input_value(timeout=5_000) == answer:
                field.press("Enter", timeout=5_000)
                return
        except Error:  # the box went while it was typed into
            pass
    raise AssertionError(f"no prompt took {answer!r}: {output_text(area)}")


def lab_command(tmp: Path, root: Path, port: int, token: str) -> list[str]:
    # Windowing off: every cell stays in the DOM, so off-screen outputs can be read.
    settings = tmp / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
    command = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.user_settings_dir={tmp / 'settings'}",
        f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
        # Nothing that reaches the network: no update checks, no extension manager on PyPI.
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
    ]
    if os.geteuid() == 0:  # CI containers run as root
        command.append("--allow-root")
    return command


def lab_env(tmp: Path) -> dict[str, str]:
    """Config, data and runtime folders of its own, so no user setting changes the test."""
    config = tmp / "jupyter-config"
    (config / "labconfig").mkdir(parents=True)
    # No "fetch news?" notification over the notebook.
    page_config = {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}
    (config / "labconfig" / "page_config.json").write_text(json.dumps(page_config))
    return {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(config),
        "JUPYTER_DATA_DIR": str(tmp / "jupyter-data"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "jupyter-runtime"),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def api(server: Lab, path: str, method: str = "GET") -> int:
    request = urllib.request.Request(
        f"{server.url}{path}",
        method=method,
        headers={"Authorization": f"token {server.token}"},
        data=b"" if method == "POST" else None,
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return int(response.status)


def wait_until_serving(server: Lab) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            pytest.fail(f"JupyterLab exited with {server.process.returncode}: {log_tail()}")
        with contextlib.suppress(OSError):
            if api(server, "/api/status") == 200:
                return
        time.sleep(0.1)
    pytest.fail(f"JupyterLab did not answer within {SERVER_START_S:g} s: {log_tail()}")


def stop_server(server: Lab) -> None:
    """Ask the server to shut its kernels down and exit; kill its process group if it won't."""
    if server.process.poll() is None:
        with contextlib.suppress(OSError):
            api(server, "/api/shutdown", method="POST")
        try:
            server.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait(timeout=10)


def log_tail(lines: int = 20) -> str:
    path = ARTIFACTS / "jupyterlab.log"
    text = path.read_text(errors="replace") if path.exists() else ""
    return "\n".join(text.splitlines()[-lines:])


STATUS_BAR = "document.querySelector('#jp-main-statusbar')?.textContent || ''"


LAST_PROMPT = (
    "[...document.querySelectorAll('.jp-NotebookPanel .jp-CodeCell .jp-InputPrompt')]"
    ".map(e => e.textContent).pop() || ''"
)


def run_all_cells(page: Any, lab: Lab, name: str, wait: bool = True) -> None:
    """Open notebook `name`, run *Run > Run All Cells* and wait until its last cell has run."""
    page.goto(f"{lab.url}/lab/tree/{name}?reset&token={lab.token}", timeout=WAIT_MS)
    wait_for_kernel_idle(page)
    page.locator(".lm-MenuBar-item", has_text=re.compile(r"^Run$")).click()
    page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()
    if wait:
        wait_until_last_cell_ran(page)


def wait_for_kernel_idle(page: Any) -> None:
    """The notebook's kernel has started: the status bar reads "Python 3 (ipykernel) | Idle"."""
    page.wait_for_function(f"() => /\\| Idle/.test({STATUS_BAR})", timeout=WAIT_MS)


def wait_until_last_cell_ran(page: Any) -> None:
    """Wait until the last code cell shows an execution count.

    The kernel runs queued cells in order, so the last one numbered means all have run. Earlier
    prompts are no guide: after a cell that raises on purpose, JupyterLab shows `[ ]` on the
    cells still queued although the kernel goes on and runs them. If a cell raises without the
    `raises-exception` tag the kernel drops the rest and goes idle: stop waiting then.
    """
    deadline = time.monotonic() + RUN_ALL_S
    idle_since: float | None = None
    while time.monotonic() < deadline:
        if re.search(r"\d", page.evaluate(f"() => {LAST_PROMPT}")):
            return
        if re.search(r"\| Idle", page.evaluate(f"() => {STATUS_BAR}")):
            idle_since = idle_since or time.monotonic()
            if time.monotonic() - idle_since > STALLED_S:
                break
        else:
            idle_since = None
        page.wait_for_timeout(200)
    prompts = page.evaluate(
        "() => [...document.querySelectorAll('.jp-NotebookPanel .jp-CodeCell .jp-InputPrompt')]"
        ".map(e => e.textContent)"
    )
    pytest.fail(f"Run All did not reach the last cell; prompts: {prompts}")


def cell_indices(name: str) -> dict[str, int]:
    """Cell id -> index in the notebook (JupyterLab's `data-windowed-list-index`)."""
    cells = json.loads((NOTEBOOKS / name).read_text())["cells"]
    return {c["id"]: i for i, c in enumerate(cells)}


def cell(page: Any, index: int) -> Any:
    return page.locator(f'.jp-NotebookPanel .jp-Cell[data-windowed-list-index="{index}"]').first


def output_text(cell_locator: Any) -> str:
    return str(cell_locator.locator(".jp-OutputArea").first.text_content() or "")


def assert_in_order(text: str, *parts: str) -> None:
    position = 0
    for part in parts:
        found = text.find(part, position)
        assert found >= 0, f"expected {part!r} (in order: {parts}) in:\n{text}"
        position = found + len(part)


def shot(page: Any, name: str) -> None:
    """A screenshot of `page` in `SHOTS`, for a failure."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SHOTS / f"{name}.png")


@pytest.fixture
def dap_log(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file the kernel writes the frontend's debug requests to (`DISTNB_DAP_LOG`), one per
    test module, for a failure."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{request.module.__name__.rsplit('.', 1)[-1]}-dap.log"
    path.unlink(missing_ok=True)
    monkeypatch.setenv("DISTNB_DAP_LOG", str(path))
    return path
