"""Attaching to a job across two hosts: time to the first verdict and stacks of every rank.

    sudo python bench/bench_attach_hosts.py [--rounds 7] [--per-host 8]

Two rehearsal hosts (`harness/hosts.py`: network, UTS, PID and mount namespaces with
their own sshd, on this machine) run one hung torchrun job of 2 x `--per-host` ranks:
`python -m distnb.run --nnodes 2 --nproc-per-node N` started over ssh on each, the second
host's launcher joining the first host's control plane (`distnb.runplace`), the run folder on a
folder both hosts see (a shared home's part). The job is `harness/train.py` in MODE hang
(rank 1 skips an all_reduce; every other rank waits in its last one), tiny on purpose: 16 torch
processes share this machine's cores.

1. **Time to the first verdict**: from `distnb.attach(run folder)` to `verdicts()` returning
   the sentence that names the skipped call, attached afresh each round.
2. **Stacks of every rank**: `snapshots()` (every rank's state and live Python stack, one
   request to every agent at once, through the first host's store), against `py-spy dump` of
   each rank's process as a user without the agent reaches it, over ssh to its host: one ssh
   and dump per rank in turn, or one ssh per host running that host's dumps at once; and, as a
   lower bound no user of two real hosts has, every dump at once from this machine, where the
   rehearsal hosts' processes are (no ssh). The four take turns in each round, each in every
   place of the order in turn.

Medians over rounds with their 95% interval (`median_ci`); ratios are quotients of two medians
with a 95% interval from a paired bootstrap over rounds. Needs root, iproute2, openssh and
py-spy (`pip install 'distnb[attach]'`).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_attach import ms, ratio
from results import saved

from harness import host_jobs as jobs
from harness.hosts import Host, Lan, missing

START_S = 900.0  # 16 ranks importing torch on 2 busy cores


def start(lan: Lan, per_host: int, logs: Path, runs: Path, mark: str, clients: list[Any]) -> Path:
    """Start the job on both hosts, each process marked with `mark`; its run folder. The ssh
    clients go to `clients` as they start, so that `jobs.end` ends what did start."""
    a, b = lan.hosts
    name = f"bench-{uuid.uuid4().hex[:6]}"
    for node, host in enumerate((a, b)):
        line = jobs.command(lan, str(node), a.addr, mark, name, per_host, DISTNB_RUNS=str(runs))
        clients.append(jobs.on(lan, host, line, logs / f"{host.name}.log"))
    return runs / name


def settled(folder: Path, ranks: int) -> list[tuple[str, int]]:
    """Every rank but 1 in its last all_reduce; each rank's (host, pid)."""
    import distnb
    from distnb.records.attach import AgentState

    j = distnb.attach(str(folder), timeout=START_S)
    deadline = time.monotonic() + START_S
    while True:
        snaps = j.snapshots(10.0)
        waiting = [s for s in snaps if s.state is AgentState.COLLECTIVE]
        if len(waiting) == ranks - 1 and all(s.current and s.current.seq == 15 for s in waiting):
            break
        assert time.monotonic() < deadline, [(s.rank, s.state) for s in snaps]
        time.sleep(0.5)
    j.detach()
    return [(s.host, s.pid) for s in snaps]


def pyspy_ways(lan: Lan, where: list[tuple[str, int]]) -> dict[str, Callable[[], object]]:
    from distnb.session.attach import procs

    spy = procs.pyspy()
    assert spy is not None, "pip install 'distnb[attach]' (py-spy)"
    hosts = {h.name: h for h in lan.hosts}

    def ssh(host: Host, line: str) -> None:
        done = subprocess.run(["ssh", *lan.ssh_args, f"root@{host.addr}", line],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0 and "Thread" in done.stdout, done.stderr

    def in_turn() -> None:
        for name, pid in where:
            ssh(hosts[name], f"{shlex.quote(spy)} dump --pid {pid}")

    def per_host() -> None:
        running = []
        for name, host in hosts.items():
            pids = [pid for n, pid in where if n == name]
            line = " & ".join(f"{shlex.quote(spy)} dump --pid {p}" for p in pids) + " & wait"
            running.append(subprocess.Popen(["ssh", *lan.ssh_args, f"root@{host.addr}", line],
                                            stdout=subprocess.DEVNULL))  # fmt: skip
        assert all(p.wait(timeout=120) == 0 for p in running)

    def here() -> None:  # no ssh: the hosts' processes are this machine's (a lower bound)
        pids = [root_pid(hosts[name], pid) for name, pid in where]
        running = [subprocess.Popen([spy, "dump", "--pid", str(p)], stdout=subprocess.DEVNULL)
                   for p in pids]  # fmt: skip
        assert all(p.wait(timeout=120) == 0 for p in running)

    return {"in turn": in_turn, "per host": per_host, "here": here}


def root_pid(host: Host, pid: int) -> int:
    """The process `pid` of `host`'s PID namespace, as this machine numbers it."""
    listed = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True, text=True)
    for root in listed.stdout.split():
        status = Path(f"/proc/{root}/status").read_text()
        ids = next(line.split()[1:] for line in status.splitlines() if line.startswith("NSpid"))
        if ids[-1] == str(pid) and len(ids) > 1:
            return int(root)
    raise LookupError(f"no process {pid} on {host.name}")


def measure(lan: Lan, folder: Path, ranks: int, rounds: int) -> None:
    import distnb

    where = settled(folder, ranks)
    verdict = []
    for _ in range(rounds):
        t = time.perf_counter()
        j = distnb.attach(str(folder), timeout=60)
        found = j.verdicts()
        verdict.append(time.perf_counter() - t)
        assert any("rank 1 skipped all_reduce #7" in v for v in found), found
        j.detach()
    print(f"# time to the first verdict: {rounds} rounds, attached afresh each round")
    print(f"{'ranks':>5} {'hosts':>5} {'ms [95%]':>22}")
    print(f"{ranks:>5} {2:>5} {ms(verdict):>22}", flush=True)
    j = distnb.attach(str(folder), timeout=60)
    ways = {"agent": lambda: j.snapshots(10.0), **pyspy_ways(lan, where)}
    times: dict[str, list[float]] = {w: [] for w in ways}
    names = list(ways)
    for i in range(rounds):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            t = time.perf_counter()
            ways[name]()
            times[name].append(time.perf_counter() - t)
    assert all(s.stack for s in j.snapshots(10.0))
    j.detach()
    agent = times["agent"]
    print(
        f"# stacks of every rank: {rounds} rounds, the four ways in turn; py-spy over ssh "
        "(in turn; per host), and from this machine without ssh (here: a lower bound)"
    )
    print(f"{'ranks':>5} {'way':<10} {'ms [95%]':>26}  against the agent [95%]")
    for name in names:
        against = "" if name == "agent" else ratio(times[name], agent)
        print(f"{ranks:>5} {name:<10} {ms(times[name]):>26}  {against}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--per-host", type=int, default=8)
    args = parser.parse_args()
    if missing():
        sys.exit(f"rehearsal hosts need {missing()}")
    mark = uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as d, saved("attach-hosts"):
        lan = Lan(Path(d))
        runs = Path(f"/run/{lan.tag}-runs")  # /run: the folder the hosts share
        runs.mkdir(mode=0o700)
        clients: list[Any] = []
        try:
            lan.add_host("h2")
            lan.add_host("h3")
            folder = start(lan, args.per_host, Path(d), runs, mark, clients)
            logs = [Path(d) / f"{h.name}.log" for h in lan.hosts]
            jobs.wait_for(logs, r"final 1 ", START_S)  # rank 1 has left the loop
            measure(lan, folder, 2 * args.per_host, args.rounds)
        finally:
            jobs.end(lan, mark, clients)
            lan.close()
            shutil.rmtree(runs, ignore_errors=True)


if __name__ == "__main__":
    main()
