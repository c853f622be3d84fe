"""The ipyparallel side of a session: one controller, one engine per rank, and every pid.

Only this module (and `cells.py`, which drives `AsyncResult`s) talks to ipyparallel. distnb owns
its processes: it records every pid the cluster starts, so `stop()` leaves nothing behind even
where ipyparallel's engine nannies would linger for seconds.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import psutil

from distnb.reaper import Reaper

# Controller settings that matter for an interactive tool:
# - threads instead of 6 forked scheduler processes (~230 MB less);
# - a 100 ms heartbeat, because registration waits for the first beat; 100 misses (10 s) before
#   an engine is dropped, so a loaded 2-core machine does not lose ranks. A rank that really
#   dies is reported at once by its nanny, not by the heartbeat.
CONTROLLER_ARGS = [
    "--IPController.use_threads=True",
    "--HeartMonitor.period=100",
    "--HeartMonitor.max_heartmonitor_misses=100",
]

# ipyparallel's log lines: "2026-11-21 09:00:00.123 [IPEngine...] ..."
_IPP_LOG = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[.,]\d+ \[")
# Shared memory that an MPI library removes only in MPI_Finalize, which a killed rank never
# reaches: OpenMPI's segments (vader in 4.x, sm in 5.x), 8 MiB a run left in /dev/shm.
_MPI_SHM = re.compile(r" (/dev/shm/(?:vader|sm)_segment\.\S*)$", re.MULTILINE)

# Launchers whose engines run this Python, so they can use distnb's engine entry point.
LOCAL_PYTHON_LAUNCHERS = {"local", "mpi", "mpiexec"}


class Cluster:
    """An ipyparallel cluster started for one session, in its own profile directory."""

    def __init__(self, n: int, engines: str, host: str, env: dict[str, str]) -> None:
        import ipyparallel as ipp

        self.n = n
        self.engines = engines
        self._own_profile = tempfile.mkdtemp(prefix="distnb-profile-")
        self.cluster = ipp.Cluster(
            n=n,
            profile_dir=self._own_profile,
            controller_ip=host,
            controller_args=CONTROLLER_ARGS,
            engines=engines,
            # Engines wait for the controller's connection file themselves, so they start
            # (and import torch) while the controller comes up instead of a second later.
            delay=0,
            send_engines_connection_env=False,
            shutdown_atexit=True,
            log_level=40,
        )
        self._env = env
        self.client: Any = None
        self._views: dict[int, Any] = {}
        self._procs: dict[int, psutil.Process] = {}
        self._reaper = Reaper()  # last: nothing above may fail and leave it behind
        self._reaper.remove_later(self._own_profile)

    def view(self, engine_id: int) -> Any:
        """The DirectView of one engine (made once: a view is a traitlets object)."""
        view = self._views.get(engine_id)
        if view is None:
            view = self._views[engine_id] = self.client[engine_id]
        return view

    def launch(self) -> None:
        """Start the controller and the engines, without waiting for them."""
        # The `_sync` forms work both with and without a running event loop (a Jupyter kernel).
        self.cluster.start_controller_sync()
        self.cluster.start_engines_sync(self.n, **self._engine_kwargs())
        self._track()

    def wait_registered(self, on_progress: Callable[[int], None], timeout: float = 120.0) -> Any:
        """A connected client, once every engine has registered with the controller."""
        self.client = self.cluster.connect_client_sync()
        future = self.client.wait_for_engines(
            self.n, block=False, timeout=timeout, interactive=False
        )
        while True:
            on_progress(len(self.client.ids))
            try:
                future.result(timeout=0.05)
                break
            except TimeoutError:
                self._raise_if_launcher_died()
        on_progress(len(self.client.ids))
        self._track()
        return self.client

    def _engine_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"environment": dict(self._env)}
        if self.engines in LOCAL_PYTHON_LAUNCHERS:
            kwargs["engine_cmd"] = [sys.executable, "-m", "distnb.rank.engine"]
        return kwargs

    def _raise_if_launcher_died(self) -> None:
        for pid, proc in list(self._procs.items()):
            if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
                code = proc.wait(0)
                raise RuntimeError(
                    f"process {pid} ({' '.join(proc_cmd(proc))[:80]}) exited with {code} "
                    f"before every engine registered; its log: {self.log_tail(pid)}"
                )

    def _track(self) -> None:
        """Remember every process the cluster started (launchers' children and theirs), and
        tell the reaper, which kills them if the kernel dies without stopping them."""
        for proc in self._launcher_processes():
            self._procs.setdefault(proc.pid, proc)
            with contextlib.suppress(psutil.NoSuchProcess):
                for child in proc.children(recursive=True):
                    self._procs.setdefault(child.pid, child)
        self._reaper.watch(list(self._procs))

    def _launcher_processes(self) -> list[psutil.Process]:
        launchers = [self.cluster.controller] if self.cluster.controller else []
        for engine_set in self.cluster.engines.values():
            launchers.extend(getattr(engine_set, "launchers", {}).values() or [engine_set])
        return [p for p in (getattr(la, "process", None) for la in launchers) if p is not None]

    def pids(self) -> list[int]:
        """Every process of this cluster still alive."""
        self._track()
        procs = [*self._procs.values(), psutil.Process(self._reaper.pid)]
        return [p.pid for p in procs if _alive(p)]

    def exit_status(self, pid: int, wait: float = 1.0) -> int | None:
        """The exit code of a local engine process (negative: killed by that signal)."""
        proc = self._procs.get(pid)
        if proc is None:
            return None
        try:
            code = proc.wait(wait)
        except psutil.TimeoutExpired:
            return None
        return int(code) if code is not None else None

    def log_tail(self, pid: int, lines: int = 5) -> str:
        """The last lines a process wrote to its log that are not ipyparallel's own logging
        (which is what follows a crash, and hides what the crash printed, e.g. gloo's
        `EnforceNotMet ... Received data size doesn't match`)."""
        launchers = [self.cluster.controller] + [
            la
            for es in self.cluster.engines.values()
            for la in getattr(es, "launchers", {}).values()
        ]
        for la in launchers:
            proc = getattr(la, "process", None)
            path = getattr(la, "output_file", None)
            if proc is not None and proc.pid == pid and path and os.path.exists(path):
                with open(path, errors="replace") as f:
                    own = [line for line in f if line.strip() and not _IPP_LOG.match(line)]
                return "".join(own[-lines:]).strip()
        return ""

    def signal(self, sig: int, engine_ids: list[int]) -> None:
        """Send a signal to engines through their nannies (works for any launcher)."""
        if self.client is not None and engine_ids:
            self.client.send_signal(sig, targets=engine_ids, block=False)

    def stop(self, timeout: float = 2.0) -> list[int]:
        """Kill every recorded process and wait until each is gone; return any that is not.

        SIGKILL, not a polite SIGTERM: nothing in a rank is worth saving at stop, and the
        engines' and controller's graceful shutdowns take ~2 s, nannies longer.
        """
        self._track()
        procs = [p for p in self._procs.values() if _alive(p)]
        if self.client is not None:
            self.client.close()
            self.client = None
        segments = _mpi_segments(procs)
        for proc in procs:
            _send(proc, signal.SIGKILL)
        alive = _wait_dead(procs, timeout)
        for path in segments:
            with contextlib.suppress(OSError):
                os.unlink(path)
        # The processes are gone already; ipyparallel only tidies its files.
        with contextlib.suppress(Exception):
            self.cluster.stop_cluster_sync()
        shutil.rmtree(self._own_profile, ignore_errors=True)
        self._reaper.close()
        return [p.pid for p in alive]


def proc_cmd(proc: psutil.Process) -> list[str]:
    try:
        return list(proc.cmdline())
    except psutil.Error:
        return []


def _mpi_segments(procs: list[psutil.Process]) -> set[str]:
    """The MPI shared-memory files these processes have mapped (see `_MPI_SHM`). From
    /proc/PID/maps: psutil's `memory_maps` reads smaps, ~30 ms for a process with torch."""
    paths: set[str] = set()
    for proc in procs:
        with contextlib.suppress(OSError), open(f"/proc/{proc.pid}/maps") as f:
            paths.update(_MPI_SHM.findall(f.read()))
    return paths


def _alive(proc: psutil.Process) -> bool:
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _wait_dead(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until no process runs. A killed nanny is reparented to init and stays a zombie
    until init reaps it, which takes init a second or more: a zombie counts as gone."""
    deadline = time.monotonic() + timeout
    alive = procs
    while alive and time.monotonic() < deadline:
        for proc in alive:
            with contextlib.suppress(psutil.TimeoutExpired, psutil.Error):
                proc.wait(0)  # reaps our own children at once
        alive = [p for p in alive if _alive(p)]
        if alive:
            time.sleep(0.005)
    return alive


def _send(proc: psutil.Process, sig: int) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        proc.send_signal(sig)
