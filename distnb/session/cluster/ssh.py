"""Engines on other hosts over ssh: the `Ssh` kind, and ending its engines from the kernel.

`Ssh` takes the hosts and their ranks (`node1:4,node2:4`), the Python on the hosts and the user's
ssh arguments, and hands them to ipyparallel's ssh launcher, with distnb's engine and keepalives.

ipyparallel's ssh launcher starts each engine as the leader of a new session on its host and
remembers its pid; its own stop asks each host in turn over ssh, with no time limit, and waits
on a thread per engine that asks again every minute. A host that no longer answers held a stop
for minutes, deaf to Ctrl-C. Here one ssh per host ends every engine of this cluster there
(SIGKILL to each engine's session: its nanny and children too) and removes the profile copy;
the hosts are asked in parallel, each within `timeout` seconds, and a host that does not answer
is named. ipyparallel's waits and its stop at exit are turned off for these engines: they are
ended here. Each engine learns the host it was launched on as the user named it
(`LAUNCHED_ON_VAR`), so that a stop can say which ranks a host that did not answer holds.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from distnb.errors import ConfigError
from distnb.records.cell import LAUNCHED_ON_VAR
from distnb.session.cluster.engines import EngineKind, engine_command
from distnb.session.control import is_loopback

__all__ = ["SSH_OPTIONS", "RemoteEngine", "Ssh", "parse_hosts", "remote_engines", "stop"]

Hosts = tuple[tuple[str, int], ...]  # (host, ranks there), in order
# After the user's own ssh arguments (ssh keeps an option's first value): a connection whose
# peer went silent ends within ~6 s instead of when TCP gives up (minutes).
SSH_OPTIONS = ("-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3")

_ASK_AGAIN_S = 10.0  # between ipyparallel's waits for an engine on a host that did not answer

# What runs on the host: SIGKILL to the session of each pid (an engine leads its own).
_KILL = (
    "import os, signal, sys\n"
    "for pid in map(int, sys.argv[1:]):\n"
    "    try:\n"
    "        os.killpg(os.getpgid(pid), signal.SIGKILL)\n"
    "    except OSError:\n"
    "        pass\n"
)


class Ssh(EngineKind):
    """Ranks on other hosts over ssh: `hosts` and their ranks, `python` there (this one's path
    by default, as on a shared home), `ssh_args` for ssh and scp (`-i key`, `-J jump`)."""

    name = "ssh"
    # Engines a silent heart monitor drops after 30 beats (3 s), not 100: a cut link only the
    # heartbeat tells (a nanny there cannot reach the controller).
    heart_misses = 30
    away = True

    def __init__(
        self,
        hosts: str | Mapping[str, int] | Hosts,
        host: str,
        n: int | None = None,
        python: str = "",
        ssh_args: Sequence[str] = (),
    ) -> None:
        if not hosts:
            raise ConfigError(
                "--engines ssh needs the hosts and their ranks: --hosts node1:4,node2:4 "
                "(distnb.start(..., hosts={'node1': 4, 'node2': 4}))"
            )
        self.hosts = parse_hosts(hosts)
        total = sum(count for _, count in self.hosts)
        if n is not None and n != total:
            raise ConfigError(f"-n {n} but --hosts names {total} ranks; give one or the other")
        if is_loopback(host) and not all(is_loopback(name) for name, _ in self.hosts):
            raise ConfigError(
                f"ranks on other hosts cannot reach the control plane on {host}: name this "
                "machine's address on the network the hosts share, e.g. --host 10.0.0.1 (the "
                "ranks' traffic then uses the interface that reaches it)"
            )
        self.python = python or sys.executable
        self.ssh_args = (*map(str, ssh_args), *SSH_OPTIONS)

    def ranks(self, n: int | None, backend: str) -> int:
        return sum(count for _, count in self.hosts)

    def launcher(self) -> type:
        return _engine_set()

    def launcher_settings(self) -> dict[str, Any]:
        return {
            "engines": dict(self.hosts),
            "remote_python": self.python,
            "engine_cmd": engine_command(self.python),
            "ssh_args": list(self.ssh_args),
            "scp_args": list(self.ssh_args),
            # named, so that the cluster can mark them (`launch.Cluster.launch`)
            "ssh_cmd": ["ssh"],
            "scp_cmd": ["scp"],
        }

    def stop(self, ipp_cluster: Any) -> list[str]:
        return stop(remote_engines(ipp_cluster))

    def __repr__(self) -> str:
        return f"Ssh(hosts={self.hosts!r})"


def parse_hosts(hosts: str | Mapping[str, int] | Hosts) -> Hosts:
    """`"a:4,b:4"`, `{"a": 4, "b": 4}` or (("a", 4), ("b", 4)) as the last; a host without a
    count gets one rank."""
    pairs: list[tuple[str, object]] = []
    if isinstance(hosts, str):
        for item in filter(None, (h.strip() for h in hosts.split(","))):
            host, _, ranks_text = item.rpartition(":") if ":" in item else (item, "", "1")
            pairs.append((host, ranks_text))
    else:
        pairs.extend(hosts.items() if isinstance(hosts, Mapping) else hosts)
    result = []
    for name, count in pairs:
        try:
            ranks = int(str(count))
        except ValueError:
            ranks = 0
        if not name or ranks < 1:
            raise ConfigError(
                f"hosts must be name:ranks pairs with ranks >= 1, e.g. node1:4,node2:4; got "
                f"{name!r}:{count!r}"
            )
        result.append((str(name), ranks))
    return tuple(result)


def _engine_set() -> type:
    """ipyparallel's ssh engine set, whose wait for an engine's end goes quiet once `stop` has
    taken the engine over (its ssh to a host that went silent ends by `SSH_OPTIONS`' keepalive,
    and would otherwise print a traceback from ipyparallel's thread)."""
    from ipyparallel.cluster.launcher import SSHEngineLauncher, SSHEngineSetLauncher

    class Engine(SSHEngineLauncher):  # type: ignore[misc]
        def get_env(self) -> dict[str, str]:
            return {**super().get_env(), LAUNCHED_ON_VAR: str(self.location)}

        def get_output(self, remove: bool = False) -> str:
            if self._stop_waiting.is_set():
                # `stop` removed the host's profile copy, which held the output: ipyparallel's
                # fetch would wait 10 s for it, an ssh round trip a second (a loaded stop: >60 s)
                return ""
            return str(super().get_output(remove))

        def wait_one(self, timeout: float) -> int:
            try:
                return int(super().wait_one(timeout))
            except subprocess.CalledProcessError:
                if self._stop_waiting.is_set():
                    return -1  # ended by `stop`, which says so if it could not
                # The host did not answer (a cut link: the controller names the rank lost):
                # ask again in a while, quietly, instead of a traceback from this thread.
                self._stop_waiting.wait(_ASK_AGAIN_S)
                raise TimeoutError("the host did not answer") from None
            except Exception:
                if self._stop_waiting.is_set():
                    return -1
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
