"""Engines on other hosts over ssh: the `Ssh` kind, and ending its engines from the kernel.

`Ssh` takes the hosts and their ranks (`node1:4,node2:4`), the Python on the hosts and the user's
ssh arguments, and hands them to ipyparallel's ssh launcher, with distnb's engine and keepalives.

ipyparallel's ssh launcher starts one engine per ssh command, each importing torch itself. Here
its engine set starts one launcher per host instead, which runs `distnb.rank.forks` with that
host's count: the host's engines are forked from one process that imported torch once, as on
this machine (`engines.forked_engines`); their logs and exit statuses stay in the host's profile
copy (`forks/`), and the kernel learns a death there from the controller, as before.

ipyparallel's ssh launcher starts each program as the leader of a new session on its host and
remembers its pid; its own stop asks each host in turn over ssh, with no time limit, and waits
on a thread per launcher that asks again every minute. A host that no longer answers held a stop
for minutes, deaf to Ctrl-C. Here one ssh per host ends every process this cluster launched
there (SIGKILL to the process group of each process that carries the cluster's mark and was
launched over ssh: the forker and its engines, each nanny, a rank's own children) and removes
the profile copy; the hosts are asked in parallel, each within `timeout` seconds, and a host
that does not answer is named. ipyparallel's waits and its stop at exit are turned off for
these engines: they are ended here. Each engine learns the host it was launched on as the user
named it (`LAUNCHED_ON_VAR`), so that a stop can say which ranks a host that did not answer
holds.
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
from distnb.reaper import MARK_VAR
from distnb.records.cell import LAUNCHED_ON_VAR
from distnb.session.cluster.engines import FORKS, EngineKind
from distnb.session.control import is_loopback

__all__ = ["SSH_OPTIONS", "RemoteEngine", "Ssh", "parse_hosts", "remote_engines", "stop"]

Hosts = tuple[tuple[str, int], ...]  # (host, ranks there), in order
# After the user's own ssh arguments (ssh keeps an option's first value): a connection whose
# peer went silent ends within ~6 s instead of when TCP gives up (minutes).
SSH_OPTIONS = ("-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3")

_ASK_AGAIN_S = 10.0  # between ipyparallel's waits for an engine on a host that did not answer

# What runs on the host: SIGKILL to the process group of every process whose environment holds
# both words (the cluster's mark, and the host name an ssh launcher gave: not the controller or
# the ssh commands of a kernel on the same machine), looking again until none is left (a process
# may fork while its group is killed). By the mark, not by pid: a forker that has ended leaves
# its engines, and a pid may have been taken since.
_KILL = (
    "import os, signal, sys, time\n"
    "mark, launched = sys.argv[1].encode(), sys.argv[2].encode()\n"
    "for _ in range(5):\n"
    "    groups = set()\n"
    "    for name in filter(str.isdigit, os.listdir('/proc')):\n"
    "        try:\n"
    "            with open(f'/proc/{name}/environ', 'rb') as f:\n"
    "                env = f.read().split(b'\\0')\n"
    "            if mark in env and any(w.startswith(launched) for w in env):\n"
    "                groups.add(os.getpgid(int(name)))\n"
    "        except OSError:\n"
    "            pass\n"
    "    groups.discard(os.getpgrp())\n"
    "    if not groups:\n"
    "        break\n"
    "    for group in groups:\n"
    "        try:\n"
    "            os.killpg(group, signal.SIGKILL)\n"
    "        except OSError:\n"
    "            pass\n"
    "    time.sleep(0.05)\n"
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
            "engine_cmd": [self.python, "-m", FORKS],  # one per host (`_engine_set`)
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
    """ipyparallel's ssh engine set, with one launcher per host that forks the host's engines
    (`distnb.rank.forks`), whose wait for its end goes quiet once `stop` has taken it over (its
    ssh to a host that went silent ends by `SSH_OPTIONS`' keepalive, and would otherwise print a
    traceback from ipyparallel's thread)."""
    from ipyparallel.cluster.launcher import SSHEngineLauncher, SSHEngineSetLauncher

    class Forks(SSHEngineLauncher):  # type: ignore[misc]
        @property
        def program(self) -> list[str]:
            # `N FOLDER` before the engines' arguments; the set names the launcher `host/0`
            count = self.parent.counts[self.identifier.rpartition("/")[0]]
            return [*self.engine_cmd, str(count), f"{self.remote_profile_dir}/forks"]

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
        launcher_class = Forks
        engines: dict[str, int]  # ipyparallel's trait (host: engines there), for mypy

        def start(self, n: int) -> list[str]:
            # ipyparallel starts one launcher per engine: here, one per host (`Forks.program`)
            self.counts = dict(self.engines)
            self.engines = dict.fromkeys(self.counts, 1)
            try:
                started = list(super().start(len(self.counts)))
            finally:
                self.engines = self.counts
            self.n = n
            self.started = dict(self.launchers)  # for `stop`, even once a launcher has ended
            return started

        def _notice_engine_stopped(self, data: dict[str, Any]) -> None:
            if data["identifier"] in self.launchers:  # not one `stop` took out (`_forget`)
                super()._notice_engine_stopped(data)

    return EngineSet


class RemoteEngine:
    """What an ssh launcher started (a host's forker, or one engine): where (`user@host`), its
    pid there, its launcher."""

    def __init__(self, engine_set: Any, key: str, launcher: Any) -> None:
        self.engine_set, self.key, self.launcher = engine_set, key, launcher
        self.location: str = launcher.location
        self.pid: int = int(launcher.pid or 0)


def remote_engines(cluster: Any) -> list[RemoteEngine]:
    """What the ssh launchers of an ipyparallel cluster started (those whose process has ended
    too: what it started may run on, and its profile copy is still there)."""
    found = []
    for engine_set in cluster.engines.values():
        launchers = getattr(engine_set, "started", None) or getattr(engine_set, "launchers", {})
        for key, launcher in launchers.items():
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
    words = (f"{MARK_VAR}={launcher.environment.get(MARK_VAR, '')}", f"{LAUNCHED_ON_VAR}=")
    remote = (
        f"{shlex.quote(launcher.remote_python)} -c {shlex.quote(_KILL)} "
        f"{' '.join(map(shlex.quote, words))} && "
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
