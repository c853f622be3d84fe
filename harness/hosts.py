"""Other hosts on this machine, for rehearsing distnb across hosts.

`Lan` is a network of rehearsal hosts: a router (a network namespace that forwards) joined to
this machine, the kernel's, at 198.18.<b>.1, and `Lan.add_host` makes a host behind it at
198.18.<b+k>.2 (b: a /22 block chosen from the process id, so that two test runs on one
machine keep apart) as a real one differs: its own network, host name, process ids, /tmp, home and
/dev/shm (network, UTS, PID and mount namespaces), and an sshd that accepts the key the `Lan`
made. The file system is otherwise shared, as a cluster's shared home is, so the remote Python is
this checkout's virtualenv. Hosts reach each other and the kernel through the router.

Addresses come from the reserved benchmarking range 198.18.0.0/15, and every side has an
`unreachable` route for the whole range, so when a host's link goes down (`Host.link(up=False)`)
packets for it fail at once instead of taking a default route. `Lan.close()` ends every process
of every host (each lives in its PID namespace) and removes the namespaces, links and routes.

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

import psutil

RANGE = "198.18.0.0/15"  # RFC 2544's benchmarking range: never routed on the internet
SSH_OPTIONS = [
    *("-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no"),
    *("-o", "UserKnownHostsFile=/dev/null", "-o", "IdentitiesOnly=yes"),
    *("-o", "LogLevel=ERROR", "-o", "ConnectTimeout=5"),
]


# The host's first process, as an init: starts sshd and reaps every orphan (an engine whose
# launcher exited is one; unreaped, it stays a zombie that ipyparallel's ssh waits on).
_INIT = (
    "import os, subprocess\n"
    'subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", "/tmp/sshd/sshd_config"])\n'
    "while True:\n"
    "    os.wait()\n"
)


def missing() -> str:
    """What this machine lacks to make rehearsal hosts ("" if nothing)."""
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


_SLASH24S = 256  # in 198.18.0.0/16, the half of RANGE the Lans take blocks of


def _taken(lan: str) -> bool:
    """Whether another test run routes `lan` (after this one undid its own)."""
    return bool(subprocess.run(["ip", "route", "show", lan], capture_output=True).stdout)


def _run(*cmd: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")


class Lan:
    """The router, the kernel's link to it, and the hosts added behind it (see the module)."""

    def __init__(self, state: Path, hosts: int = 3) -> None:
        """Room for `hosts` hosts (3 by default; more for a bench across many)."""
        self.state = state
        # /24s taken: the kernel's link and one per host, a power of two (a /22 for 3 hosts)
        self.size = 1 << max(2, hosts.bit_length())
        self.tag = f"dnbt{os.getpid() % 100000}"
        self.router = f"{self.tag}-lan"
        self.key = state / "id_ed25519"
        self.hosts: list[Host] = []
        self._undo: list[list[str]] = []  # commands that undo what was made, last first
        # 198.18.<block>.0/22: the kernel's link and 3 hosts. Test runs side by side each take a
        # block no other has routed (from their pid on, the next free one; `_make` fails on a
        # block another run routed meanwhile, and the next is tried).
        blocks = _SLASH24S // self.size
        for k in range(blocks):
            self._use((os.getpid() + k) % blocks)
            if subprocess.run(["ip", "route", "show", self.lan], capture_output=True).stdout:
                continue
            try:
                self._make()
                return
            except BaseException:
                self.close()
                if not _taken(self.lan):
                    raise
        raise RuntimeError(f"every block of {RANGE} is routed by other test runs")

    def _use(self, n: int) -> None:
        self.block = self.size * n
        self.lan = f"198.18.{self.block}.0/{24 - self.size.bit_length() + 1}"
        self.kernel_addr, self.router_addr = f"198.18.{self.block}.1", f"198.18.{self.block}.2"

    def _make(self) -> None:
        _run("ip", "netns", "add", self.router)
        self._undo.append(["ip", "netns", "del", self.router])
        kernel_if = f"{self.tag}k"
        _run("ip", "link", "add", kernel_if, "type", "veth", "peer", "name", f"{self.tag}r")
        self._undo.append(["ip", "link", "del", kernel_if])
        _run("ip", "link", "set", f"{self.tag}r", "netns", self.router)
        _run("ip", "addr", "add", f"{self.kernel_addr}/30", "dev", kernel_if)
        _run("ip", "link", "set", kernel_if, "up")
        inside = self.in_router
        _run(*inside, "ip", "addr", "add", f"{self.router_addr}/30", "dev", f"{self.tag}r")
        _run(*inside, "ip", "link", "set", f"{self.tag}r", "up")
        _run(*inside, "sysctl", "-qw", "net.ipv4.ip_forward=1")  # this namespace's own
        _run(*inside, "ip", "route", "add", "unreachable", RANGE)
        _run("ip", "route", "add", self.lan, "via", self.router_addr)
        self._undo.append(["ip", "route", "del", self.lan])
        if subprocess.run(["ip", "route", "add", "unreachable", RANGE]).returncode == 0:
            self._undo.append(["ip", "route", "del", "unreachable", RANGE])
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key))

    @property
    def in_router(self) -> list[str]:
        return ["ip", "netns", "exec", self.router]

    @property
    def ssh_args(self) -> list[str]:
        """What ssh (and scp) need to reach the hosts: the test's key and no known_hosts file."""
        return ["-i", str(self.key), *SSH_OPTIONS]

    def add_host(self, name: str) -> Host:
        if len(self.hosts) + 1 >= self.size:
            raise ValueError(f"this Lan has room for {self.size - 1} hosts: Lan(state, hosts=N)")
        host = Host(self, name, len(self.hosts) + 1)
        self.hosts.append(host)
        return host

    def close(self) -> None:
        """End every host's processes and this machine's ssh clients of them (one to a host
        that was cut off waits for its keepalive), then remove what was made."""
        for host in self.hosts:
            host.stop()
        for proc in psutil.process_iter(["cmdline"]):
            if str(self.key) in (proc.info["cmdline"] or []):
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        for cmd in reversed(self._undo):
            subprocess.run(cmd, capture_output=True)
        self._undo.clear()


class Host:
    """Host `name` at 198.18.<block+index>.2, behind the `Lan`'s router."""

    def __init__(self, lan: Lan, name: str, index: int) -> None:
        self.lan, self.name = lan, name
        self.netns = f"{lan.tag}-{name}"
        self.router_if, self.remote_if = f"{lan.tag}r{index}", f"{lan.tag}h{index}"
        net = f"198.18.{lan.block + index}"
        self.gateway, self.addr = f"{net}.1", f"{net}.2"
        self.root = lan.state / name  # its /tmp and home are folders here, seen from the kernel
        self.tmp, self.home = self.root / "tmp", self.root / "home"
        self._sshd: subprocess.Popen[bytes] | None = None
        _run("ip", "netns", "add", self.netns)
        lan._undo.append(["ip", "netns", "del", self.netns])
        self._link()
        try:
            self._start_sshd()
        except BaseException:
            self.stop()
            raise

    @property
    def inside(self) -> list[str]:
        """The prefix of a command run in the host's network."""
        return ["ip", "netns", "exec", self.netns]

    def _link(self) -> None:
        router = self.lan.in_router
        _run(*router, "ip", "link", "add", self.router_if, "type", "veth", "peer", "name",
             self.remote_if)  # fmt: skip
        _run(*router, "ip", "link", "set", self.remote_if, "netns", self.netns)
        _run(*router, "ip", "addr", "add", f"{self.gateway}/30", "dev", self.router_if)
        _run(*router, "ip", "link", "set", self.router_if, "up")
        _run(*self.inside, "ip", "addr", "add", f"{self.addr}/30", "dev", self.remote_if)
        _run(*self.inside, "ip", "link", "set", self.remote_if, "up")
        _run(*self.inside, "ip", "link", "set", "lo", "up")
        _run(*self.inside, "ip", "route", "add", self.lan.lan, "via", self.gateway)
        _run(*self.inside, "ip", "route", "add", "unreachable", RANGE)

    def _start_sshd(self) -> None:
        sshd_dir = self.tmp / "sshd"  # /tmp/sshd on the host
        sshd_dir.mkdir(parents=True)
        self.home.mkdir()
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(sshd_dir / "host_key"))
        shutil.copy(f"{self.lan.key}.pub", sshd_dir / "authorized_keys")
        (sshd_dir / "sshd_config").write_text(
            f"ListenAddress {self.addr}\nHostKey /tmp/sshd/host_key\n"
            "AuthorizedKeysFile /tmp/sshd/authorized_keys\nPermitRootLogin yes\n"
            "StrictModes no\nUsePAM no\nPidFile /tmp/sshd/pid\n"
            "Subsystem sftp /usr/lib/openssh/sftp-server\n"
        )
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
        # A private home and /tmp, but for the Python, the virtualenv and this checkout where
        # they lie under either (pyenv's Python, a clone in /tmp): a cluster's hosts share those
        # through a shared file system, or have their own copy at the same path.
        home, keep = Path.home(), []
        shared = {Path(p).resolve() for p in (sys.base_prefix, sys.prefix, _checkout())}
        for path in sorted(shared):
            for private, over in ((self.home, home), (self.tmp, Path("/tmp"))):
                if path.is_relative_to(over):
                    (private / path.relative_to(over)).mkdir(parents=True, exist_ok=True)
                    keep.append(f"mount --bind {path} {private / path.relative_to(over)} && ")
        setup = (
            f"hostname {self.name} && {''.join(keep)}mount --rbind {self.home} {home} && "
            f"mount --rbind {self.tmp} /tmp && mount -t tmpfs tmpfs /dev/shm && "
            f"exec {sys.executable} -c '{_INIT}'"
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

    def ssh(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ssh", *self.lan.ssh_args, f"root@{self.addr}", command],
            capture_output=True,
            text=True,
            timeout=30,
        )

    def processes(self) -> list[str]:
        """The command lines running on the host, but its sshd."""
        lines = self.ssh("ps -eo pid=,args=").stdout.splitlines()
        return [line for line in lines if "sshd" not in line and "ps -eo" not in line]

    def distnb_processes(self) -> list[psutil.Process]:
        """The engines (and their forker) and nannies running on the host, seen from this machine
        (its network namespace's processes), so that they can be watched while its link is down."""
        listed = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True)
        found = []
        for pid in map(int, listed.stdout.split()):
            try:
                proc = psutil.Process(pid)
                line = " ".join(proc.cmdline())
            except psutil.Error:
                continue
            if any(w in line for w in ("distnb.rank.engine", "distnb.rank.forks", "engine.nanny")):
                found.append(proc)
        return found

    def link(self, up: bool) -> None:
        """Take the host's link down (as a cable pulled) or up again."""
        _run(*self.lan.in_router, "ip", "link", "set", self.router_if, "up" if up else "down")

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.root / "sshd.log").read_text(errors="replace")[-2000:]
        return ""

    def stop(self) -> None:
        """End every process of the host (its sshd is its PID namespace's first)."""
        if self._sshd is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._sshd.pid, signal.SIGKILL)  # unshare's --kill-child ends the rest
            self._sshd.wait()
            self._sshd = None


def _checkout() -> str:
    """The folder distnb is imported from (this checkout, for an editable install)."""
    import distnb

    return str(Path(distnb.__file__).resolve().parents[1])
