"""The ipyparallel cluster of a session: one controller, one engine per rank, launched and ended.

distnb owns its processes: a reaper is armed before the first launch, every process the cluster
starts carries its mark and is recorded with its role (`members.Members`), and `stop()` kills
every recorded pid, so nothing is left behind, even where ipyparallel's engine nannies would
linger for seconds. The commands a launcher runs here to reach other hosts (ssh, scp: its
waits for each remote engine among them) carry the mark too, so a dead kernel's reaper ends
them at once. What differs between launchers is the engine kind's (`engines.EngineKind`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import secrets
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import psutil

from distnb.errors import warn
from distnb.reaper import MARK_VAR, Reaper, marked
from distnb.session.cluster import processes
from distnb.session.cluster.engines import EngineKind
from distnb.session.cluster.members import Member, Members, describe
from distnb.session.cluster.teardown import LIFELINE_BOUND_S

__all__ = ["Cluster", "Ended", "port_taken"]

# Controller settings that matter for an interactive tool: threads instead of 6 forked
# scheduler processes (~230 MB less); a 100 ms heartbeat, because registration waits for the
# first beat (how many beats an engine may miss is its kind's: `EngineKind.heart_misses`).
CONTROLLER_ARGS = ["--IPController.use_threads=True", "--HeartMonitor.period=100"]
_TRACK_EVERY_S = 0.5  # while engines register: look for the processes they start
_WORKING = 0.05  # of a core, over _JUDGE_EVERY_S: engines here still start (the wait goes on)
_JUDGE_EVERY_S = 2.0
_STRETCH = 5  # at most this many times the registration timeout, however long they work
_CONNECT_S = 1.0  # a slice of the wait for the controller's first answer
_LOCAL_COMMANDS = ("ssh_cmd", "scp_cmd")  # a launcher's commands that run on this machine


@dataclass(frozen=True, slots=True)
class Ended:
    """What `Cluster.stop` did: processes of this machine ended, any still alive, and the
    hosts (as the engine kind names them) that did not answer."""

    processes: int
    left: tuple[int, ...]
    silent: tuple[str, ...]


class Cluster:
    """An ipyparallel cluster started for one session, in its own profile directory.

    `ipp` is ipyparallel's cluster; `members` records every process it started here.
    """

    def __init__(self, n: int, kind: EngineKind, host: str) -> None:
        import ipyparallel as ipp

        self.n = n
        self.kind = kind
        self.mark = secrets.token_hex(8)
        self._own_profile = tempfile.mkdtemp(prefix="distnb-profile-", dir=kind.profile_parent())
        self.ipp = ipp.Cluster(
            n=n,
            profile_dir=self._own_profile,
            controller_ip=host,
            controller_args=[
                *CONTROLLER_ARGS,
                f"--HeartMonitor.max_heartmonitor_misses={kind.heart_misses}",
            ],
            engines=kind.launcher(),
            # Engines wait for the controller's connection file themselves, so they start
            # (and import torch) while the controller comes up instead of a second later.
            delay=0,
            send_engines_connection_env=False,
            # distnb stops its clusters at exit itself (`session.core._stop_all`), by pid and
            # at once; ipyparallel's handler would print its repr and stop them politely.
            shutdown_atexit=False,
            log_level=40,
        )
        self.client: Any = None
        self._views: dict[int, Any] = {}
        # Armed before anything is launched; last, so nothing above may fail and leave it.
        self._reaper = Reaper(self.mark)
        self._reaper.remove_later(self._own_profile)
        self.members = Members(self.ipp, self._reaper, self._own_profile)

    def view(self, engine_id: int) -> Any:
        """The DirectView of one engine (made once: a view is a traitlets object)."""
        view = self._views.get(engine_id)
        if view is None:
            view = self._views[engine_id] = self.client[engine_id]
        return view

    def forget(self, results: Iterable[Any]) -> None:
        """Drop finished requests' ids from the client's history: ipyparallel clears its
        caches of a request's reply and output once both arrived, but keeps every msg_id in
        `client.history` for the client's life (and looks a stray reply up in it, a list).
        Requests still running are kept."""
        done = {mid for ar in results if ar.done() for mid in ar.msg_ids}
        if done and self.client is not None:
            self.client.history = [m for m in self.client.history if m not in done]

    def launch(self) -> None:
        """Start the controller and the engines, without waiting for them."""
        # The `_sync` forms work both with and without a running event loop (a Jupyter kernel).
        self.ipp.start_controller_sync(environment={MARK_VAR: self.mark})
        self.members.track()
        environment = {**self.kind.environment(self.n), MARK_VAR: self.mark}
        settings = self.kind.launcher_settings()
        for name in _LOCAL_COMMANDS:
            if name in settings:  # `env` passes the mark to the command it runs
                settings[name] = ["env", f"{MARK_VAR}={self.mark}", *settings[name]]
        self.ipp.start_engines_sync(self.n, environment=environment, **settings)
        self.members.track()
        for engine_set in self.ipp.engines.values():
            if getattr(engine_set, "launchers", None) == {}:
                # none started, or all ended already: what they said, as ipyparallel kept it
                kind, said = type(engine_set).__name__, engine_set.get_output()
                raise RuntimeError(
                    f"ipyparallel's {kind} started no engine process that is still running "
                    f"({self.kind})" + (f"; their output:\n{said}" if said else "")
                )

    def remove_later(self, pattern: str) -> None:
        """Have the reaper remove the files matching `pattern` if the kernel dies."""
        self._reaper.remove_matching_later(pattern)

    def wait_registered(self, on_progress: Callable[[str, int], None], timeout: float) -> Any:
        """A connected client, once every engine has registered with the controller.

        Fails as soon as a launched process dies (with its output), and once `timeout` seconds
        have passed without progress, with the engines that did register and the launchers'
        output. Progress is an engine registering, or the engines on this machine working (at
        least `_WORKING` of a core: importing torch on a busy machine or in a 1-CPU container),
        not waiting for what will not come; at most `_STRETCH` times `timeout` in all.
        """
        start = tracked = judged = time.monotonic()
        deadline = start + timeout
        cpu, registered, queued = self.members.engines_cpu_seconds(), 0, ""
        self.client = self._connect(deadline)
        future = self.client.wait_for_engines(self.n, block=False, interactive=False)
        while not future.done():
            _registered(on_progress, self.client.ids, queued)  # queued: a batch job's state
            now = time.monotonic()
            if now - tracked >= _TRACK_EVERY_S:
                self.members.track()
                queued = self.kind.queued(list(self.ipp.engines.values()))
                tracked = now
            if now - judged >= _JUDGE_EVERY_S or (now >= deadline and now - judged >= 1.0):
                spent = self.members.engines_cpu_seconds()
                working = spent - cpu >= _WORKING * (now - judged)
                if working or len(self.client.ids) > registered:
                    deadline = min(now + timeout, start + _STRETCH * timeout)
                cpu, registered, judged = spent, len(self.client.ids), now
            self.members.raise_if_launcher_died()
            if time.monotonic() >= deadline:
                raise RuntimeError(self._not_registered(timeout, time.monotonic() - start, queued))
            concurrent.futures.wait([future], timeout=0.05)
        future.result()
        _registered(on_progress, self.client.ids)
        self.members.track()
        return self.client

    def _connect(self, deadline: float) -> Any:
        """A client of the controller; asked in slices of `_CONNECT_S`, so that a controller
        that dies meanwhile is named at once instead of ipyparallel's 10 s "Hub connection
        request timed out"."""
        while True:
            self.members.raise_if_launcher_died()
            try:
                return self.ipp.connect_client_sync(timeout=_CONNECT_S)
            except Exception:
                self.members.raise_if_launcher_died()  # the cause, if the controller died
                if time.monotonic() >= deadline:
                    raise

    def wait_all(self, pending: list[Any], timeout: float) -> list[Any]:
        """The results of engine AsyncResults, failing at once if a process of the cluster dies
        (the controller's death would otherwise leave them waiting until `timeout`)."""
        deadline = time.monotonic() + timeout
        for ar in pending:
            while not ar.ready() and time.monotonic() < deadline and not self.raise_if_dead():
                ar.wait(0.05)
            if not ar.ready():
                raise TimeoutError(f"the engines did not answer within {timeout:g} s")
        self.raise_if_dead()  # an engine's death, rather than ipyparallel's word for it
        return [ar.get() for ar in pending]

    def raise_if_dead(self) -> bool:
        """Raise if a process the cluster cannot work without has died (else False)."""
        gone: Member | None = self.members.dead()
        if gone is not None:
            raise RuntimeError(f"{describe(gone)} {self.members.how_died(gone.pid)}")
        return False

    def _not_registered(self, timeout: float, waited: float, queued: str) -> str:
        ids = sorted(self.client.ids)
        idle = f", the last {timeout:g} s without progress" if waited > timeout + 1 else ""
        return (
            f"{len(ids)} of {self.n} engines registered in {waited:.0f} s{idle} "
            f"(registered: {', '.join(map(str, ids)) or 'none'}{'; ' * bool(queued)}{queued}); "
            "a slow machine or batch queue may need longer (distnb.start(register_timeout="
            "...)). The launchers' output:\n"
            + ("\n".join(self.members.launcher_outputs()) or "(none)")
        )

    def pids(self) -> list[int]:
        """Every process of this cluster still alive."""
        self.members.track()
        reaper = psutil.Process(self._reaper.pid)
        return [p.pid for p in [*self.members.alive(), reaper] if processes.alive(p)]

    def signal(self, sig: int, engine_ids: list[int]) -> None:
        """Send a signal to engines through their nannies (works for any launcher)."""
        if self.client is not None and engine_ids:
            self.client.send_signal(sig, targets=engine_ids, block=False)

    def stop(self, timeout: float = 2.0) -> Ended:
        """Kill every recorded process and wait until each is gone; say what was ended, what
        is not, and which hosts did not answer.

        SIGKILL, not a polite SIGTERM: nothing in a rank is worth saving at stop, and the
        engines' and controller's graceful shutdowns take ~2 s, nannies longer. Processes
        that carry the cluster's mark but were never seen (a nanny whose engine died before
        registering) are found by the mark.
        """
        with contextlib.suppress(Exception):
            self.members.track()
        procs = self.members.alive()
        seen = {p.pid for p in procs}
        for pid in marked(self.mark):
            if pid not in seen:
                with contextlib.suppress(psutil.Error):
                    procs.append(psutil.Process(pid))
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.close()
            self.client = None
        segments = processes.mpi_segments(procs)
        silent = self.kind.stop(self.ipp)
        for proc in procs:
            processes.send(proc, signal.SIGKILL)
        alive = processes.wait_dead(procs, timeout)
        for path in segments:
            with contextlib.suppress(OSError):
                os.unlink(path)
        # The processes are gone already; ipyparallel only tidies its files.
        with contextlib.suppress(Exception):
            self.ipp.stop_cluster_sync()
        shutil.rmtree(self._own_profile, ignore_errors=True)
        self.members.close()
        self._reaper.close()
        if silent:  # last: a warning made an error must not leave anything running
            warn(
                f"{', '.join(silent)} did not answer the stop: the ranks there end by themselves "
                f"within {LIFELINE_BOUND_S:.0f} s of losing the kernel"
            )
        left = tuple(p.pid for p in alive)
        return Ended(len(procs) - len(left), left, tuple(silent))


def _registered(on_progress: Callable[[str, int], None], ids: list[int], queued: str = "") -> None:
    """Progress of the registration: which engines are in (`engines registered (0, 2)`), or
    how their batch job waits."""
    which = f" ({', '.join(map(str, sorted(ids)))})" if ids else ""
    on_progress(queued or f"engines registered{which}", len(ids))


def port_taken(exc: BaseException) -> bool:
    """Whether a start failed because a port ipyparallel's controller picked (free when picked,
    bound later by its processes) was taken meanwhile by another process on this machine."""
    return "Address already in use" in str(exc)
