"""Engines on other hosts: ending them from the kernel, bounded and all hosts at once.

ipyparallel's ssh launcher starts each engine as the leader of a new session on its host and
remembers its pid; its own stop asks each host in turn over ssh, with no time limit, and waits
on a thread per engine that asks again every minute. A host that no longer answers held a stop
for minutes, deaf to Ctrl-C. Here one ssh per host ends every engine of this cluster there
(SIGKILL to each engine's session: its nanny and children too) and removes the profile copy;
the hosts are asked in parallel, each within `timeout` seconds, and a host that does not answer
is named. ipyparallel's waits and its stop at exit are turned off for these engines: they are
ended here.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from collections import defaultdict
from typing import Any

__all__ = [
    "REMOTE_LOST",
    "SSH_OPTIONS",
    "RemoteEngine",
    "remote_engines",
    "ssh_engine_set",
    "stop",
]

# How an engine on another host ended, as far as the kernel can tell: the controller stopped
# hearing it (a nanny there reports a death; a cut link, only the heartbeat's silence tells).
REMOTE_LOST = (
    "left the cluster (the process died, or its host or the network to it went down; the exit "
    "status of a process on another host is not known here)"
)
# After the user's own ssh arguments (ssh keeps an option's first value): a connection whose
# peer went silent ends within ~6 s instead of when TCP gives up (minutes).
SSH_OPTIONS = ("-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3")

# What runs on the host: SIGKILL to the session of each pid (an engine leads its own).
_KILL = (
    "import os, signal, sys\n"
    "for pid in map(int, sys.argv[1:]):\n"
    "    try:\n"
    "        os.killpg(os.getpgid(pid), signal.SIGKILL)\n"
    "    except OSError:\n"
    "        pass\n"
)


def ssh_engine_set() -> type:
    """ipyparallel's ssh engine set, whose wait for an engine's end goes quiet once `stop` has
    taken the engine over (its ssh to a host that went silent ends by `SSH_OPTIONS`' keepalive,
    and would otherwise print a traceback from ipyparallel's thread)."""
    from ipyparallel.cluster.launcher import SSHEngineLauncher, SSHEngineSetLauncher

    class Engine(SSHEngineLauncher):  # type: ignore[misc]
        def wait_one(self, timeout: float) -> int:
            try:
                return int(super().wait_one(timeout))
            except Exception:
                if self._stop_waiting.is_set():
                    return -1  # ended by `stop`, which says so if it could not
                raise

    class EngineSet(SSHEngineSetLauncher):  # type: ignore[misc]
        launcher_class = Engine

        def _notice_engine_stopped(self, data: dict[str, Any]) -> None:
            if data["identifier"] in self.launchers:  # not one `stop` took out (`_forget`)
                super()._notice_engine_stopped(data)

    return EngineSet


class RemoteEngine:
    """An engine an ssh launcher started: where (`user@host`), its pid there, its launcher."""

    def __init__(self, engine_set: Any, key: str, launcher: Any) -> None:
        self.engine_set, self.key, self.launcher = engine_set, key, launcher
        self.location: str = launcher.location
        self.pid: int = int(launcher.pid or 0)


def remote_engines(cluster: Any) -> list[RemoteEngine]:
    """The engines of an ipyparallel cluster that ssh launchers started."""
    found = []
    for engine_set in cluster.engines.values():
        for key, launcher in getattr(engine_set, "launchers", {}).items():
            if hasattr(launcher, "ssh_sender") and launcher.pid:
                found.append(RemoteEngine(engine_set, key, launcher))
    return found


def stop(engines: list[RemoteEngine], timeout: float = 5.0) -> list[str]:
    """End `engines` and remove their profile copies; return the hosts that did not confirm."""
    for engine in engines:
        _forget(engine)
    by_host: dict[str, list[RemoteEngine]] = defaultdict(list)
    for engine in engines:
        by_host[engine.location].append(engine)
    running = {host: _kill(group) for host, group in by_host.items()}
    deadline = time.monotonic() + timeout
    silent = []
    for host, proc in running.items():
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.returncode != 0:
            silent.append(host)
    for engine in engines:  # ipyparallel's wait ends once it sees the engine gone
        thread = getattr(engine.launcher, "_wait_thread", None)
        if thread is not None and engine.location not in silent:
            thread.join(max(0.0, deadline - time.monotonic()))
    return silent


def _kill(engines: list[RemoteEngine]) -> subprocess.Popen[bytes]:
    launcher = engines[0].launcher
    pids = [str(e.pid) for e in engines]
    remote = (
        f"{shlex.quote(launcher.remote_python)} -c {shlex.quote(_KILL)} {' '.join(pids)}; "
        f"rm -rf {shlex.quote(launcher.remote_profile_dir)}"
    )
    ssh = [*launcher.ssh_cmd, *launcher.ssh_args, "-o", "ConnectTimeout=3", launcher.location]
    return subprocess.Popen(
        [*ssh, remote],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _forget(engine: RemoteEngine) -> None:
    """Stop ipyparallel's wait thread (an ssh a minute) and take the launcher out of its engine
    set, so that ipyparallel's stop (and its stop at exit) does not ask the host again."""
    waiting = getattr(engine.launcher, "_stop_waiting", None)
    if waiting is not None:
        waiting.set()
    engine.engine_set.launchers.pop(engine.key, None)
