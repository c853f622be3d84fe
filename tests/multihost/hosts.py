"""A second host on this machine, for rehearsing distnb across hosts.

`SecondHost` makes one as a real one differs: its own network (a network namespace joined to
this one by a veth pair, on addresses of the reserved benchmarking range 198.18.0.0/15), its own
host name, process ids, /tmp, home and /dev/shm (UTS, PID and mount namespaces), and an sshd
that accepts a key made for the test. The file system is otherwise shared, as a cluster's shared
home is, so the remote Python is this checkout's virtualenv.

Nothing leaks: both sides get an `unreachable` route for the whole range, so when the link goes
down (`link(up=False)`) packets for the other host fail at once instead of taking the default
route. `close()` ends every process of the host (they live in its PID namespace) and removes the
namespace, the link and the routes.

Needs root, iproute2, util-linux's `unshare` and openssh's `sshd` and `ssh` (.ci/run installs
them); `missing()` says what is not there.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

RANGE = "198.18.0.0/15"  # RFC 2544's benchmarking range: never routed on the internet
SSH_OPTIONS = [
    "-o",
    "BatchMode=yes",
    "-o",
    "StrictHostKeyChecking=no",
    "-o",
    "UserKnownHostsFile=/dev/null",
    "-o",
    "IdentitiesOnly=yes",
    "-o",
    "LogLevel=ERROR",
    "-o",
    "ConnectTimeout=5",
]


def missing() -> str:
    """What this machine lacks to make a second host ("" if nothing)."""
    if os.geteuid() != 0:
        return "root (network namespaces)"
    for tool in ("ip", "unshare", "ssh", "scp", "ssh-keygen"):
        if shutil.which(tool) is None:
            return tool
    if not os.path.exists("/usr/sbin/sshd"):
        return "sshd (openssh-server)"
    probe = f"dnbt-probe{os.getpid()}"
    if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode != 0:
        return "the right to make network namespaces"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


class SecondHost:
    """Host `name` at 198.18.<net>.2, reached from this one's 198.18.<net>.1 (see the module)."""

    def __init__(self, state: Path, name: str = "h2", net: int = 77) -> None:
        self.name = name
        self.tag = f"dnbt{os.getpid() % 100000}"
        self.netns = f"{self.tag}-{name}"
        self.local_if, self.remote_if = f"{self.tag}a", f"{self.tag}b"
        self.local_addr, self.addr = f"198.18.{net}.1", f"198.18.{net}.2"
        self.root = state  # its /tmp and home are folders here, seen from this host
        self.tmp, self.home = state / "tmp", state / "home"
        self.key = state / "id_ed25519"
        self._sshd: subprocess.Popen[bytes] | None = None
        self._made: list[list[str]] = []  # commands that undo what was made, last first
        try:
            self._make_network()
            self._start_sshd()
        except BaseException:
            self.close()
            raise

    @property
    def inside(self) -> list[str]:
        """The prefix of a command run in the host's network."""
        return ["ip", "netns", "exec", self.netns]

    # --- making it ------------------------------------------------------------------------------

    def _undo(self, *cmd: str) -> None:
        self._made.append(list(cmd))

    def _make_network(self) -> None:
        _run("ip", "netns", "add", self.netns)
        self._undo("ip", "netns", "del", self.netns)
        _run("ip", "link", "add", self.local_if, "type", "veth", "peer", "name", self.remote_if)
        self._undo("ip", "link", "del", self.local_if)
        _run("ip", "link", "set", self.remote_if, "netns", self.netns)
        _run("ip", "addr", "add", f"{self.local_addr}/30", "dev", self.local_if)
        _run("ip", "link", "set", self.local_if, "up")
        inside = self.inside
        _run(*inside, "ip", "addr", "add", f"{self.addr}/30", "dev", self.remote_if)
        _run(*inside, "ip", "link", "set", self.remote_if, "up")
        _run(*inside, "ip", "link", "set", "lo", "up")
        _run(*inside, "ip", "route", "add", "unreachable", RANGE)
        if subprocess.run(["ip", "route", "add", "unreachable", RANGE]).returncode == 0:
            self._undo("ip", "route", "del", "unreachable", RANGE)

    def _start_sshd(self) -> None:
        sshd_dir = self.tmp / "sshd"  # /tmp/sshd on the host
        sshd_dir.mkdir(parents=True)
        self.home.mkdir()
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key))
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(sshd_dir / "host_key"))
        shutil.copy(f"{self.key}.pub", sshd_dir / "authorized_keys")
        (sshd_dir / "sshd_config").write_text(
            f"ListenAddress {self.addr}\nHostKey /tmp/sshd/host_key\n"
            "AuthorizedKeysFile /tmp/sshd/authorized_keys\nPermitRootLogin yes\n"
            "StrictModes no\nUsePAM no\nPidFile /tmp/sshd/pid\nAcceptEnv *\n"
            "Subsystem sftp /usr/lib/openssh/sftp-server\n"
        )
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
        # A private home, but for the Python the virtualenv points at if it lies under home
        # (pyenv's): a cluster's hosts have their own home or share one with the Python in it.
        home, keep = Path.home(), ""
        base = Path(sys.base_prefix).resolve()
        if base.is_relative_to(home):
            (self.home / base.relative_to(home)).mkdir(parents=True)
            keep = f"mount --bind {base} {self.home / base.relative_to(home)} && "
        setup = (
            f"hostname {self.name} && {keep}mount --rbind {self.home} {home} && "
            f"mount --bind {self.tmp} /tmp && mount -t tmpfs tmpfs /dev/shm && "
            "exec /usr/sbin/sshd -D -e -f /tmp/sshd/sshd_config"
        )
        namespaces = ["unshare", "--uts", "--mount", "--pid", "--fork", "--kill-child"]
        self._sshd = subprocess.Popen(
            [*self.inside, *namespaces, "--mount-proc", "sh", "-c", setup],
            stdout=subprocess.DEVNULL,
            stderr=open(self.root / "sshd.log", "wb"),  # noqa: SIM115
            start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while self.ssh("true").returncode != 0:
            if time.monotonic() > deadline or self._sshd.poll() is not None:
                raise RuntimeError(f"sshd on {self.name} did not start: {self.log()}")
            time.sleep(0.1)

    # --- using it -------------------------------------------------------------------------------

    @property
    def ssh_args(self) -> list[str]:
        """What ssh (and scp) need to reach the host: the test's key and no known_hosts file."""
        return ["-i", str(self.key), *SSH_OPTIONS]

    def ssh(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ssh", *self.ssh_args, f"root@{self.addr}", command],
            capture_output=True,
            text=True,
            timeout=30,
        )

    def processes(self) -> list[str]:
        """The command lines running on the host, but its sshd."""
        lines = self.ssh("ps -eo pid=,args=").stdout.splitlines()
        return [line for line in lines if "sshd" not in line and "ps -eo" not in line]

    def link(self, up: bool) -> None:
        """Take the link between the hosts down (as a cable pulled) or up again."""
        _run("ip", "link", "set", self.local_if, "up" if up else "down")

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.root / "sshd.log").read_text(errors="replace")[-2000:]
        return ""

    def close(self) -> None:
        """End every process of the host, then remove what was made."""
        if self._sshd is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._sshd.pid, signal.SIGKILL)  # unshare's --kill-child ends the rest
            self._sshd.wait()
            self._sshd = None
        for cmd in reversed(self._made):
            subprocess.run(cmd, capture_output=True)
        self._made.clear()
