"""torchrun jobs on the rehearsal hosts, started as their users start them: `python -m
distnb.run --nnodes N --node-rank R ...` over ssh on each host, or `srun` inside a Slurm batch
job; `harness/train.py` on gloo, one interface per host named for gloo (as a cluster's
users name theirs: the hosts' names resolve nowhere). Every process of a job carries a mark in
its environment, so `end` finds and ends them all, whichever host and session they are in."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness.hosts import Host, Lan
from harness.jobs import START_S, TRAIN
from harness.processes import NAMED_S

PYTHON = shlex.quote(sys.executable)
# the interface a host's route to the kernel leaves from, for gloo (`ip route get`, in a shell)
IFNAME = "$(ip -o route get {kernel} | sed -n 's/.* dev \\([^ ]*\\).*/\\1/p')"


def port() -> int:
    """A rendezvous port of this test run's own (two runs on one machine keep apart)."""
    return 20000 + os.getpid() % 20000


def command(
    lan: Lan, node_rank: str, master: str, mark: str, run: str = "", nproc: int = 1,
    agent: bool = True, **env: str,
) -> str:  # fmt: skip
    """The shell line that starts one node's launcher of a job on two nodes, `nproc` ranks on
    each: static rendezvous on `master`; `run`: the run's name (`--distnb-run`), else the Slurm
    job's; `agent=False`: plain torchrun (`python -m torch.distributed.run`)."""
    settings = {"JOBMARK": mark, "MODE": "hang", "STEPS": "8", "SKIP_AT": "3", **env}
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in settings.items())
    gloo = IFNAME.format(kernel=lan.kernel_addr)
    own = f"--distnb-run {run} " if run else ""
    launcher = f"distnb.run {own}" if agent else "torch.distributed.run "
    return (
        f"cd /tmp && GLOO_SOCKET_IFNAME={gloo} {exports} exec {PYTHON} -m {launcher}"
        f"--nnodes 2 --node-rank {node_rank} --nproc-per-node {nproc} --master-addr {master} "
        f"--master-port {port()} {TRAIN}"
    )


def on(lan: Lan, host: Host, line: str, log: Path) -> subprocess.Popen[bytes]:
    """`line` run on `host` over ssh, its output in `log`, until it ends or `end` ends it."""
    with log.open("ab") as out:
        return subprocess.Popen(
            ["ssh", *lan.ssh_args, f"root@{host.addr}", line],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip


RUNS = ".distnb/runs"  # under each host's own home


def scp(lan: Lan, source: str, target: str) -> None:
    done = subprocess.run(["scp", "-rpq", *lan.ssh_args, source, target], capture_output=True,
                          text=True, timeout=30)  # fmt: skip
    assert done.returncode == 0, done.stderr


def across(
    lan: Lan, name: str, mark: str, logs: list[Path], here: Path, **env: str
) -> list[subprocess.Popen[bytes]]:
    """A job of one rank on each of the first two hosts, as its users start one without a shared
    home: the first host's launcher hosts the control plane, its run folder is copied to `here`
    (this machine's `DISTNB_RUNS`) and to the second host, whose launcher then joins. Returns the
    ssh clients (for `end`), appended to as they start, so a failure leaves them to end."""
    a, b = lan.hosts[0], lan.hosts[1]
    clients = [on(lan, a, command(lan, "0", a.addr, mark, name, **env), logs[0])]
    try:
        deadline = time.monotonic() + START_S
        while a.ssh(f"test -f {RUNS}/{name}/endpoint.json").returncode != 0:
            assert time.monotonic() < deadline, logs[0].read_text()
            time.sleep(0.2)
        here.mkdir(mode=0o700)
        scp(lan, f"root@{a.addr}:{RUNS}/{name}", str(here))
        assert b.ssh(f"mkdir -p -m 700 {RUNS}").returncode == 0
        scp(lan, str(here / name), f"root@{b.addr}:{RUNS}/")
        clients.append(on(lan, b, command(lan, "1", a.addr, mark, name, **env), logs[1]))
    except BaseException:
        end(lan, mark, clients)
        raise
    return clients


def wait_for(logs: list[Path], pattern: str, timeout_s: float = START_S) -> None:
    """Until one of `logs` shows `pattern`; what they hold if it does not come."""
    deadline = time.monotonic() + timeout_s
    while not any(re.search(pattern, log.read_text(errors="replace")) for log in logs):
        text = "\n".join(log.read_text(errors="replace")[-2000:] for log in logs)
        assert time.monotonic() < deadline, f"no {pattern!r}:\n{text}"
        time.sleep(0.2)


def end(lan: Lan, mark: str, clients: list[subprocess.Popen[bytes]]) -> None:
    """End the job: every process of every host whose environment holds `mark` (launchers,
    workers, srun's steps), then the ssh clients that started them. A killed process is
    listed until the kernel has torn it down, and a launcher may start one more meanwhile:
    the job's processes are killed until none is listed."""
    deadline = time.monotonic() + NAMED_S
    while (pids := left(lan, mark)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    for client in clients:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(client.pid, signal.SIGKILL)
        client.wait(timeout=30)


def left(lan: Lan, mark: str) -> list[int]:
    """The processes of the job still on the hosts."""
    needle = f"JOBMARK={mark}\0".encode()
    found = []
    for host in lan.hosts:
        listed = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True,
                                text=True)  # fmt: skip
        for pid in map(int, listed.stdout.split()):
            with contextlib.suppress(OSError):
                if needle in Path(f"/proc/{pid}/environ").read_bytes():
                    found.append(pid)
    return found
