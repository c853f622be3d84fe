"""The ipyparallel side of a session: one controller, one engine per rank, and every pid.

Only this module (and `cells.py`, which drives `AsyncResult`s) talks to ipyparallel. distnb owns
its processes: a reaper is armed before the first launch, every process the cluster starts
carries its mark, and `stop()` kills every recorded pid, so nothing is left behind, even where
ipyparallel's engine nannies would linger for seconds. Each recorded process has a role
(`distnb.session.watch.Role`), so the session can say which one died and what that means.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import psutil

from distnb.errors import DistnbWarning
from distnb.reaper import MARK_VAR, Reaper, marked
from distnb.session import processes, remote, slurm
from distnb.session.failures import exit_text
from distnb.session.watch import Member, Role, own_lines

# Controller settings that matter for an interactive tool:
# - threads instead of 6 forked scheduler processes (~230 MB less);
# - a 100 ms heartbeat, because registration waits for the first beat; 100 misses (10 s) before
#   an engine is dropped, so a loaded 2-core machine does not lose ranks. A rank that really
#   dies is reported at once by its nanny, not by the heartbeat.
CONTROLLER_ARGS = ["--IPController.use_threads=True", "--HeartMonitor.period=100"]
# Misses allowed: 100, but 30 for engines on other hosts, whose cut link only the heartbeat
# tells (a nanny there cannot reach the controller): 3 s of silence instead of 10.
HEART_MISSES = {"ssh": 30, "slurm": 30}
# Launchers distnb adapts (ssh: a bounded stop; Slurm: a step in an allocation, a watched job).
_LAUNCHERS = {"ssh": remote.ssh_engine_set, "slurm": slurm.engine_set}
_TRACK_EVERY_S = 0.5  # while engines register: look for the processes they start
_CONNECT_S = 1.0  # a slice of the wait for the controller's first answer
_SETTLE_S = 0.5  # for a dead process's parent to end too (see `Cluster.lost`)

# Launchers whose engines run this Python, so they can use distnb's engine entry point.
LOCAL_PYTHON_LAUNCHERS = {"local", "mpi", "mpiexec"}


class Cluster:
    """An ipyparallel cluster started for one session, in its own profile directory."""

    def __init__(
        self,
        n: int,
        engines: str,
        host: str,
        env: dict[str, str],
        settings: dict[str, Any] | None = None,
    ) -> None:
        import ipyparallel as ipp

        self.n = n
        self.engines = engines
        self.mark = secrets.token_hex(8)
        self._own_profile = tempfile.mkdtemp(
            prefix="distnb-profile-", dir=slurm.shared_folder() if engines == "slurm" else None
        )
        self.cluster = ipp.Cluster(
            n=n,
            profile_dir=self._own_profile,
            controller_ip=host,
            controller_args=[
                *CONTROLLER_ARGS,
                f"--HeartMonitor.max_heartmonitor_misses={HEART_MISSES.get(engines, 100)}",
            ],
            engines=_LAUNCHERS[engines]() if engines in _LAUNCHERS else engines,
            # Engines wait for the controller's connection file themselves, so they start
            # (and import torch) while the controller comes up instead of a second later.
            delay=0,
            send_engines_connection_env=False,
            shutdown_atexit=True,
            log_level=40,
        )
        self._env = {**env, MARK_VAR: self.mark}
        self._settings = settings or {}  # the launcher's (`Options.launcher_settings`)
        self.client: Any = None
        self._views: dict[int, Any] = {}
        self._procs: dict[int, psutil.Process] = {}
        self._members: dict[int, Member] = {}
        self._log_marks: dict[int, int] = {}
        self._launcher_by_pid: dict[int, Any] = {}
        self._logs: dict[int, str] = {}  # pid -> a hard link to its launcher's log file
        self._exits = processes.Exits()  # of the vital processes and the launchers'
        # Armed before anything is launched; last, so nothing above may fail and leave it.
        self._reaper = Reaper(self.mark)
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
        self.cluster.start_controller_sync(environment={MARK_VAR: self.mark})
        self._track()
        self.cluster.start_engines_sync(self.n, **self._engine_kwargs())
        self._track()
        for engine_set in self.cluster.engines.values():
            if getattr(engine_set, "launchers", None) == {}:
                raise RuntimeError(_nothing_started(self.engines, engine_set))

    def remove_later(self, pattern: str) -> None:
        """Have the reaper remove the files matching `pattern` if the kernel dies."""
        self._reaper.remove_matching_later(pattern)

    def wait_registered(self, on_progress: Callable[[str, int], None], timeout: float) -> Any:
        """A connected client, once every engine has registered with the controller.

        Fails as soon as a launched process dies (with its output), and after `timeout`
        seconds with the engines that did register and the launchers' output.
        """
        deadline = time.monotonic() + timeout
        self.client = self._connect(deadline)
        future = self.client.wait_for_engines(self.n, block=False, interactive=False)
        tracked, queued = time.monotonic(), ""  # queued: how a batch job stands, if it waits
        while not future.done():
            _registered(on_progress, self.client.ids, queued)
            if time.monotonic() - tracked >= _TRACK_EVERY_S:
                self._track()
                queued = slurm.waiting(list(self.cluster.engines.values()))
                tracked = time.monotonic()
            self._raise_if_launcher_died()
            if time.monotonic() >= deadline:
                raise RuntimeError(self._not_registered(timeout, queued))
            concurrent.futures.wait([future], timeout=0.05)
        future.result()
        _registered(on_progress, self.client.ids)
        self._track()
        return self.client

    def _connect(self, deadline: float) -> Any:
        """A client of the controller; asked in slices of `_CONNECT_S`, so that a controller
        that dies meanwhile is named at once instead of ipyparallel's 10 s "Hub connection
        request timed out"."""
        while True:
            self._raise_if_launcher_died()
            try:
                return self.cluster.connect_client_sync(timeout=_CONNECT_S)
            except Exception:
                self._raise_if_launcher_died()  # the cause, if the controller died meanwhile
                if time.monotonic() >= deadline:
                    raise

    def wait_all(self, pending: list[Any], timeout: float) -> list[Any]:
        """The results of engine AsyncResults, failing at once if a process of the cluster dies
        (the controller's death would otherwise leave them waiting until `timeout`)."""
        deadline = time.monotonic() + timeout
        for ar in pending:
            while not ar.ready() and time.monotonic() < deadline and not self.raise_if_lost():
                ar.wait(0.05)
            if not ar.ready():
                raise TimeoutError(f"the engines did not answer within {timeout:g} s")
        self.raise_if_lost()  # an engine's death, rather than ipyparallel's word for it
        return [ar.get() for ar in pending]

    def raise_if_lost(self) -> bool:
        """Raise if a process the cluster cannot work without is gone (else False)."""
        gone = self.lost()
        if gone is not None:
            raise RuntimeError(f"{self.describe(gone)} {self.how(gone)}")
        return False

    def _engine_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"environment": dict(self._env), **self._settings}
        if self.engines in LOCAL_PYTHON_LAUNCHERS:
            kwargs["engine_cmd"] = [sys.executable, "-m", "distnb.rank.engine"]
        return kwargs

    def _raise_if_launcher_died(self) -> None:
        """Launchers' own processes and vital ones (short-lived helpers may come and go)."""
        for member in list(self._members.values()):
            if (member.parent == 0 or member.role.vital) and not self._up(member):
                output = self.log_tail(member.pid)
                raise RuntimeError(
                    f"{self.describe(member)} {self.how(member)} before every engine "
                    "registered" + (f"; its output:\n{output}" if output else "")
                )

    def _not_registered(self, timeout: float, queued: str) -> str:
        ids = sorted(self.client.ids)
        outputs = [
            f"{la_name}:\n{tail}"
            for la_name, pid in self._launcher_pids()
            if (tail := self.log_tail(pid, lines=8))
        ]
        return (
            f"{len(ids)} of {self.n} engines registered within {timeout:g} s "
            f"(registered: {', '.join(map(str, ids)) or 'none'}{'; ' * bool(queued)}{queued}); "
            "a slow machine or batch "
            "queue may need longer (distnb.start(register_timeout=...)). The launchers' output:\n"
            + ("\n".join(outputs) or "(none)")
        )

    def _track(self) -> None:
        """Remember every process the cluster started (launchers' children and theirs) with its
        role, and tell the reaper, which kills them if the kernel dies without stopping them."""
        engine_launchers = {p.pid for p in self._engine_processes()}
        for top in self._launcher_processes():
            self._add(top, processes.role_of(top, engine_launchers), 0)
            self._launcher_of(top.pid)
            with contextlib.suppress(psutil.NoSuchProcess):
                for child in top.children(recursive=True):
                    ppid = processes.parent_pid(child)
                    if ppid is None:
                        continue  # gone already: a short-lived helper, not a launcher's own
                    self._add(child, processes.child_role(child, self._members.get(ppid)), ppid)
        self._reaper.watch(list(self._procs))

    def _add(self, proc: psutil.Process, role: Role, parent: int) -> None:
        if proc.pid not in self._procs:
            self._procs[proc.pid] = proc
            self._members[proc.pid] = Member(proc.pid, role, parent)
            if role.vital or parent == 0:
                self._exits.add(proc)

    def _launcher_processes(self) -> list[psutil.Process]:
        controller = processes.process_of(self.cluster.controller)
        return ([controller] if controller is not None else []) + self._engine_processes()

    def _engine_processes(self) -> list[psutil.Process]:
        launchers: list[Any] = []
        for engine_set in self.cluster.engines.values():
            launchers.extend(getattr(engine_set, "launchers", {}).values() or [engine_set])
        return [p for p in map(processes.process_of, launchers) if p is not None]

    def _launcher_pids(self) -> list[tuple[str, int]]:
        """(what it is, pid) for each process a launcher started."""
        return [(self.describe(m), m.pid) for m in self._members.values() if m.parent == 0]

    def members(self) -> list[Member]:
        """Every recorded process of this cluster, with its role."""
        return list(self._members.values())

    def lost(self) -> Member | None:
        """A process the cluster cannot work without (controller, its heart monitor, an
        engine, a nanny) that is gone, or None. One poll() of their pidfds.

        One death brings others: a nanny exits when its engine dies, a controller told to
        stop ends its heart monitor first. The one named is the cause: a gone child's parent,
        if that ends too within `_SETTLE_S`.
        """
        ended = self._exits.ended()
        gone = next((m for m in self._members.values() if m.role.vital and m.pid in ended), None)
        parent = self._members.get(gone.parent) if gone is not None else None
        if parent is not None and parent.role.vital:
            # Polled, not waited for: the parent may be the kernel's child, whose exit status
            # is ipyparallel's thread's to collect (see `exit_status`).
            deadline = time.monotonic() + _SETTLE_S
            while self._up(parent) and time.monotonic() < deadline:
                time.sleep(0.01)
            if not self._up(parent):
                return parent
        return gone

    def _up(self, member: Member) -> bool:
        if member.pid in self._exits:
            return member.pid not in self._exits.ended()
        return processes.alive(self._procs[member.pid])

    def stopped(self, pid: int) -> bool:
        """Whether a process of this cluster is stopped (SIGSTOP, a debugger's stop): it cannot
        answer anything until it is continued."""
        proc = self._procs.get(pid)
        return proc is not None and processes.stopped(proc)

    def describe(self, member: Member) -> str:
        """`the ipyparallel controller (pid 4242)`; ranks are named by the session."""
        return f"{member.role.value} (pid {member.pid})"

    def how(self, member: Member) -> str:
        """`was killed by SIGKILL`, `exited with code 0`, or `died` where no status is known."""
        code = self.exit_status(member.pid)
        return exit_text(code) if code is not None else "died"

    def pids(self) -> list[int]:
        """Every process of this cluster still alive."""
        self._track()
        procs = [*self._procs.values(), psutil.Process(self._reaper.pid)]
        return [p.pid for p in procs if processes.alive(p)]

    def exit_status(self, pid: int, wait: float = 1.0) -> int | None:
        """The exit code of a process a launcher started (negative: killed by that signal);
        None for the others (their parent is not the kernel) or one still running.

        ipyparallel's launcher waits for its process in a thread of its own, and psutil keeps
        the status on the process object; a second waiter would race that thread for the
        status, and the loser gets None ("exit status unknown"). So this waits for the thread.
        """
        proc = self._procs.get(pid)
        launcher = self._launcher_of(pid)
        if proc is None or launcher is None:
            return None
        thread = getattr(launcher, "_wait_thread", None)
        if thread is not None:
            thread.join(wait)
            if thread.is_alive():
                return None
        try:
            code = proc.wait(0 if thread is not None else wait)
        except (psutil.TimeoutExpired, psutil.Error):
            return None
        return int(code) if code is not None else None

    def mark_logs(self, pids: Iterable[int]) -> None:
        """Remember how far each process's log has come: what follows is the next cell's."""
        for pid in pids:
            path = self.log_path(pid)
            with contextlib.suppress(OSError):
                self._log_marks[pid] = os.path.getsize(path) if path else 0

    def log_tail(self, pid: int, lines: int = 5, since: int = 0) -> str:
        """The last lines a process wrote to its log from byte `since` on that are not
        ipyparallel's own logging (which is what follows a crash, and hides what the crash
        printed, e.g. gloo's `EnforceNotMet ... Received data size doesn't match`)."""
        path = self.log_path(pid)
        if not path:
            return ""
        try:
            with open(path, "rb") as f:
                f.seek(since)
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(own_lines(text)[-lines:])

    def log_since_mark(self, pid: int) -> str:
        """What a process wrote to its log since `mark_logs` last saw it."""
        return self.log_tail(pid, lines=100_000, since=self._log_marks.get(pid, 0))

    def _launcher_of(self, pid: int) -> Any:
        # Kept from `_track`: in a kernel, whose event loop runs ipyparallel's callbacks, an
        # engine set forgets the launcher of an engine that died, and removes its log file;
        # a hard link keeps the log for the death report.
        if pid not in self._launcher_by_pid:
            for la in self._launchers():
                if getattr(getattr(la, "process", None), "pid", None) == pid:
                    self._launcher_by_pid[pid] = la
                    self._keep_log(pid, getattr(la, "output_file", None))
        return self._launcher_by_pid.get(pid)

    def _keep_log(self, pid: int, path: Any) -> None:
        if isinstance(path, str) and path:
            kept = os.path.join(self._own_profile, f"distnb-{pid}.log")
            with contextlib.suppress(OSError):
                os.link(path, kept)
                self._logs[pid] = kept

    def log_shared(self, pid: int) -> bool:
        """Whether the process writes to its launcher's log with others (under mpiexec)."""
        return self._launcher_of(pid) is None and bool(self.log_path(pid))

    def log_path(self, pid: int) -> str:
        """The log a process writes to (ranks under mpiexec share its log), or ""."""
        launcher = self._launcher_of(pid)
        if launcher is None and (member := self._members.get(pid)) and member.parent:
            launcher = self._launcher_of(member.parent)  # an MPI rank writes to mpiexec's
        if launcher is None:
            return ""
        path = self._logs.get(launcher.process.pid, getattr(launcher, "output_file", None))
        return path if isinstance(path, str) and os.path.exists(path) else ""

    def _launchers(self) -> list[Any]:
        return [self.cluster.controller] + [
            la
            for es in self.cluster.engines.values()
            for la in (getattr(es, "launchers", {}).values() or [es])
        ]

    def signal(self, sig: int, engine_ids: list[int]) -> None:
        """Send a signal to engines through their nannies (works for any launcher)."""
        if self.client is not None and engine_ids:
            self.client.send_signal(sig, targets=engine_ids, block=False)

    def stop(self, timeout: float = 2.0) -> list[int]:
        """Kill every recorded process and wait until each is gone; return any that is not.

        SIGKILL, not a polite SIGTERM: nothing in a rank is worth saving at stop, and the
        engines' and controller's graceful shutdowns take ~2 s, nannies longer. Processes
        that carry the cluster's mark but were never seen (a nanny whose engine died before
        registering) are found by the mark.
        """
        with contextlib.suppress(Exception):
            self._track()
        procs = [p for p in self._procs.values() if processes.alive(p)]
        for pid in marked(self.mark):
            if pid not in self._procs:
                with contextlib.suppress(psutil.Error):
                    procs.append(psutil.Process(pid))
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.close()
            self.client = None
        segments = processes.mpi_segments(procs)
        silent = remote.stop(remote.remote_engines(self.cluster))
        for proc in procs:
            processes.send(proc, signal.SIGKILL)
        alive = processes.wait_dead(procs, timeout)
        for path in segments:
            with contextlib.suppress(OSError):
                os.unlink(path)
        # The processes are gone already; ipyparallel only tidies its files.
        with contextlib.suppress(Exception):
            self.cluster.stop_cluster_sync()
        shutil.rmtree(self._own_profile, ignore_errors=True)
        self._exits.close()
        self._reaper.close()
        if silent:  # last: a warning made an error must not leave anything running
            warnings.warn(
                f"{', '.join(silent)} did not answer the stop: the ranks there end by themselves "
                "once their controller's heartbeat stops (about 30 s)",
                DistnbWarning,
                stacklevel=4,
            )
        return [p.pid for p in alive]


def _registered(on_progress: Callable[[str, int], None], ids: list[int], queued: str = "") -> None:
    """Progress of the registration: which engines are in (`engines registered (0, 2)`), or
    how their batch job waits."""
    which = f" ({', '.join(map(str, sorted(ids)))})" if ids else ""
    on_progress(queued or f"engines registered{which}", len(ids))


def _nothing_started(engines: str, engine_set: Any) -> str:
    kind = type(engine_set).__name__
    return f"ipyparallel's {kind} started no engine process (--engines {engines})."
