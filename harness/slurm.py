"""A Slurm cluster on the rehearsal hosts: slurmctld on the first, a slurmd on each, munge.

Debian's slurm-wlm and munge, as a small cluster runs them: the controller on a head node
(here also a compute node), a slurmd per node with its node name and address, and the nodes'
shared folder holding slurm.conf, munge's socket and whatever the jobs must see from the
submitting machine (the kernel's: `shared`). One munged serves every host through that folder,
as hosts with one key each would. Each host gets the cgroup mounts this machine has (slurmd
will not start without them; `ip netns exec` hides them), and its daemons live in its PID
namespace, so `Lan.close()` ends them; `close()` ends munged and removes the folder.

The kernel submits with `SLURM_CONF` set (`env`), as a login node whose slurm.conf lies
elsewhere would.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil

from harness.hosts import Host, Lan

TOOLS = ("slurmctld", "slurmd", "munged", "sbatch", "srun", "squeue", "scancel")
CPUS_PER_NODE = 2  # what each node offers: `-n 4` is 2 tasks on each of two nodes

_CGROUPS = (
    "mount -t tmpfs cgroup /sys/fs/cgroup && "
    "for c in cpu cpuacct cpuset memory devices freezer pids; do "
    "mkdir /sys/fs/cgroup/$c && mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c; done && "
    "mkdir /sys/fs/cgroup/systemd && mount -t cgroup -o none,name=systemd cgroup "
    "/sys/fs/cgroup/systemd"
)


def missing() -> str:
    """What this machine lacks to run the rehearsal's Slurm ("" if nothing)."""
    for tool in TOOLS:
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            return f"{tool} (Debian's slurm-wlm and munge)"
    if not os.path.exists("/etc/munge/munge.key"):
        return "munge's key (/etc/munge/munge.key)"
    return ""


class Slurm:
    """Slurm on `hosts` of `lan`: partition `debug` holds them all (see the module); each node
    offers `cpus` CPUs (what it claims: the hosts share this machine's)."""

    def __init__(self, lan: Lan, hosts: list[Host], cpus: int = CPUS_PER_NODE) -> None:
        self.hosts = hosts
        self.cpus = cpus
        self.shared = Path(f"/run/{lan.tag}-slurm")  # /run is the one folder hosts share
        self.shared.mkdir()
        self.conf = self.shared / "slurm.conf"
        self.env = {"SLURM_CONF": str(self.conf)}
        self._munged = self.shared / "munged.pid"
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        socket = self.shared / "munge.socket"
        files = {"pid": self._munged, "log": self.shared / "munged.log"}
        files["seed"] = self.shared / "munged.seed"
        munged = ["munged", f"--socket={socket}", "--key-file=/etc/munge/munge.key", "--force"]
        munged += [f"--{name}-file={path}" for name, path in files.items()]
        subprocess.run(munged, check=True, capture_output=True)
        head = self.hosts[0]
        nodes = "".join(
            f"NodeName={h.name} NodeAddr={h.addr} CPUs={self.cpus} State=UNKNOWN\n"
            for h in self.hosts
        )
        self.conf.write_text(
            f"ClusterName=rehearsal\nSlurmctldHost={head.name}({head.addr})\n"
            f"AuthType=auth/munge\nAuthInfo=socket={socket}\nCredType=cred/munge\n"
            "SlurmUser=root\nSlurmdUser=root\nStateSaveLocation=/tmp/slurmctld\n"
            "SlurmdSpoolDir=/tmp/slurmd\nSlurmctldPidFile=/tmp/slurmctld.pid\n"
            "SlurmdPidFile=/tmp/slurmd.pid\nSlurmctldLogFile=/tmp/slurmctld.log\n"
            "SlurmdLogFile=/tmp/slurmd.log\nProctrackType=proctrack/linuxproc\n"
            "TaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n"
            "SwitchType=switch/none\nMpiDefault=none\nReturnToService=2\n"
            "SchedulerType=sched/builtin\nSelectType=select/cons_tres\n"
            "SelectTypeParameters=CR_CPU\nSlurmdParameters=config_overrides\n"
            f"{nodes}PartitionName=debug Nodes={','.join(h.name for h in self.hosts)} "
            "Default=YES MaxTime=INFINITE State=UP\n"
        )
        # from a clean state: a cluster made earlier on these hosts (another test module's) left
        # its jobs and nodes' states there, which a new controller would recover
        fresh = "rm -rf /tmp/slurmctld /tmp/slurmd /tmp/slurmctld.log /tmp/slurmd.log"
        _on(head, f"{fresh} && mkdir -p /tmp/slurmctld && slurmctld -f {self.conf}")
        for host in self.hosts:
            begin = f"{_CGROUPS} && {fresh if host is not head else 'true'} && mkdir -p /tmp/slurmd"
            _on(host, f"{begin} && slurmd -f {self.conf} -N {host.name}")
        deadline = time.monotonic() + 30
        while self.command("sinfo", "-h", "-o", "%t").stdout.split() != ["idle"]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Slurm nodes did not come up: {self.log(head)}")
            time.sleep(0.2)

    def command(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """A Slurm command run here, the submitting machine."""
        return subprocess.run(
            args, env={**os.environ, **self.env}, capture_output=True, text=True, timeout=timeout
        )

    def jobs(self) -> list[str]:
        """`id state` of each job the controller still counts as queued or running."""
        return self.command("squeue", "-h", "-o", "%i %T").stdout.split("\n")[:-1]

    def resume(self, host: Host) -> None:
        """After `host` was cut off: what an administrator does for a node Slurm still counts as
        completing a job (its own retries take minutes): down, then back in service."""
        for state in ("down reason=rehearsal", "resume"):
            self.command("scontrol", "update", f"nodename={host.name}", *f"state={state}".split())
        deadline = time.monotonic() + 30
        while self.command("sinfo", "-h", "-n", host.name, "-o", "%t").stdout.strip() != "idle":
            if time.monotonic() > deadline:
                raise RuntimeError(f"{host.name} did not come back: {self.log(host)}")
            time.sleep(0.2)

    def log(self, host: Host) -> str:
        return host.ssh("tail -n 20 /tmp/slurmctld.log /tmp/slurmd.log").stdout

    def close(self) -> None:
        """End the daemons (the hosts stay, for other tests) and munged; remove the folder."""
        for host in self.hosts:
            host.ssh("pkill -9 -f 'slurm(ctld|d|stepd|scriptd)'")
        with contextlib.suppress(OSError, ValueError, psutil.Error):
            munged = psutil.Process(int(self._munged.read_text()))
            munged.send_signal(signal.SIGTERM)
            munged.wait(10)  # it writes its seed file as it ends
        shutil.rmtree(self.shared, ignore_errors=True)


def _on(host: Host, command: str) -> None:
    done = host.ssh(command)
    if done.returncode != 0:
        raise RuntimeError(f"{host.name}: {command}: {done.stdout}{done.stderr}")
