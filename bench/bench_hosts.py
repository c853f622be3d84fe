"""Ranks on two hosts over ssh and Slurm: distnb's start against ipyparallel's own, the
check's cost, and what a stranger writing over the control plane's keys costs a cell.

    sudo python bench/bench_hosts.py [--repeats 5] [--parts start cost stranger lifeline slurm]
    sudo python bench/bench_hosts.py --parts forked [--ranks 2 8]   (bench/results/hosts-forked.txt)
    sudo python bench/bench_hosts.py --parts slurm-forked [--ranks 2 4]
                                                    (bench/results/hosts-slurm-forked.txt)

Needs root (it makes the rehearsal hosts of `harness/hosts.py`: two hosts behind a
router, each with its own network, host name, PIDs, /tmp, home and /dev/shm, and an sshd), and
for the Slurm rows Debian's slurm-wlm and munge (`harness/slurm.py`: slurmctld on the
first host, a slurmd on each).

- start: 2 ranks on each host, from the call until every rank is in a gloo process group across
  the hosts. distnb: `distnb.start(hosts=..., host=..., ssh_args=...)`, or `engines="slurm"`
  (a job of its own, `--ntasks-per-node 2`). The peer: ipyparallel's `Cluster(engines="ssh")`
  with the same hosts and ssh arguments, or `Cluster(engines="slurm")` with the same sbatch
  options, and its defaults, then `import torch` on the engines and `init_process_group("gloo")`
  through a TCPStore on the kernel's address, each engine on the interface that reaches it (as
  distnb sets it). The two alternate which goes first, repeat by repeat; ratio of the medians,
  paired by repeat.
- cost: an 8-element all_reduce between the hosts (fingerprints through the store, signed),
  checked against unchecked, in rounds that alternate.
- stranger: a cell of 20 checked all_reduces across the hosts, 0.1 s apart, while something on
  the network overwrites every key of the session with random bytes every few milliseconds
  for the cell's first 2 s (`harness/stranger.py`), against the same cell left alone,
  in rounds that alternate: what re-posting forged values costs (`distnb.contract.posts`).
- lifeline: one rank on the first host and three on the second, which sleep, spin in Python
  and wait in a collective when the second host's link goes down, and stays down: the time
  from the cut until that host runs no engine or nanny (`distnb.rank.lifeline`), once per
  repeat, each with a session of its own.
- forked (alone, not among the defaults): distnb's start at 2 hosts of `--ranks` each, its
  engines forked on each host from one process that imported torch once (`distnb.rank.forks`,
  one ssh launcher per host), against the same start with one ssh command per engine, each
  importing torch (how distnb started them before): the time from the call until every rank is
  in the gloo group, and the memory the hosts' processes hold then (the sum of their PSS:
  pages a forker shares with its engines count once). In rounds that alternate.
- slurm-forked (alone): the same through Slurm, a job of its own (`--ntasks-per-node RANKS`,
  the nodes claiming as many CPUs): each node's engines forked by its first task, the other
  tasks holding their places (`distnb.rank.slurm_tasks`), against each task running distnb's
  engine (how distnb started them before). Each start waits for an empty queue; the PSS counts
  the forkers, engines, nannies and holding tasks (and the job's srun on the first node).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from median_ci import median_ci, ratio_of_medians  # noqa: E402

import distnb  # noqa: E402
from distnb.errors import RankDiedError  # noqa: E402
from distnb.records.cell import LAUNCHED_ON_VAR  # noqa: E402
from distnb.session.cluster import slurm as slurm_kind  # noqa: E402
from distnb.session.cluster import ssh  # noqa: E402
from distnb.session.cluster.engines import engine_command  # noqa: E402
from harness.hosts import Host, Lan, missing  # noqa: E402
from harness.slurm import Slurm  # noqa: E402
from harness.slurm import missing as slurm_missing  # noqa: E402
from harness.stranger import Stranger  # noqa: E402

RANKS_PER_HOST = 2
SBATCH = ["--ntasks-per-node", str(RANKS_PER_HOST)]
ATTACK_S = 2.0
LOOP = (
    "import time\nfor _ in range(20):\n    x = torch.ones(8)\n    dist.all_reduce(x)\n"
    "    time.sleep(0.1)"
)
PARTS = ("start", "cost", "stranger", "lifeline", "slurm")  # the defaults
ALONE = ("forked", "slurm-forked")  # parts run only when named
BUSY = (  # what the ranks on the host cut off do (rank 0, on the other host, waits too)
    "import time\nx = torch.ones(1)\nif rank == 1:\n    time.sleep(600)\nelif rank == 2:\n"
    "    while True:\n        pass\nelse:\n    dist.all_reduce(x)"
)


def distnb_start(lan: Lan, engines: str = "ssh") -> tuple[float, distnb.Session]:
    n = RANKS_PER_HOST * len(lan.hosts)
    where: dict[str, object] = {"hosts": {h.addr: RANKS_PER_HOST for h in lan.hosts}}
    if engines == "slurm":
        where = {"n": n, "engines": "slurm", "slurm": SBATCH}
    started = time.perf_counter()
    session = distnb.start(host=lan.kernel_addr, ssh_args=lan.ssh_args, progress=False, **where)  # type: ignore[arg-type]
    return time.perf_counter() - started, session


def raw_start(lan: Lan, engines: str = "ssh") -> float:
    """ipyparallel's ssh or Slurm engines with its defaults, then torch and a gloo group across
    hosts."""
    import ipyparallel as ipp
    import torch.distributed as dist
    from IPython.paths import get_ipython_dir

    started = time.perf_counter()
    n = RANKS_PER_HOST * len(lan.hosts)
    # where the nodes see it, for Slurm's engines (a shared home)
    profile = tempfile.mkdtemp(prefix="bench-ipp-", dir=get_ipython_dir())
    cluster = ipp.Cluster(
        n=n,
        profile_dir=profile,
        controller_ip=lan.kernel_addr,
        engines=engines,
        log_level=40,
    )
    store = dist.TCPStore(lan.kernel_addr, 0, is_master=True, wait_for_workers=False)
    launcher: dict[str, object] = {
        "submit_command": ["sbatch", *SBATCH],
        # ipyparallel writes its batch script in the working folder unless given a path
        "batch_file_name": os.path.join(profile, "slurm_engine.sbatch"),
    }
    if engines == "ssh":
        launcher = {
            "engines": {h.addr: RANKS_PER_HOST for h in lan.hosts},
            "remote_python": sys.executable,
            "ssh_args": lan.ssh_args,
            "scp_args": lan.ssh_args,
        }
    try:
        cluster.start_controller_sync()
        cluster.start_engines_sync(n, **launcher)
        client = cluster.connect_client_sync()
        client.wait_for_engines(n, timeout=120)
        view = client[:]
        view.scatter("rank", list(range(n)), flatten=True, block=True)
        view.execute(
            "import os, torch, torch.distributed as dist\n"
            "from distnb.rank.torchrun import interface_towards\n"
            f"os.environ['GLOO_SOCKET_IFNAME'] = interface_towards({lan.kernel_addr!r})\n"
            f"store = dist.TCPStore({lan.kernel_addr!r}, {store.port}, is_master=False)\n"
            f"dist.init_process_group('gloo', store=store, rank=rank, world_size={n})",
            block=True,
        )
        return time.perf_counter() - started
    finally:
        cluster.stop_cluster_sync()
        shutil.rmtree(profile, ignore_errors=True)


def cost(session: distnb.Session, rounds: int, iters: int) -> dict[str, list[float]]:
    code = (
        "import time\nx = torch.ones(8)\nt = time.perf_counter()\n"
        f"for _ in range({iters}):\n    dist.all_reduce(x)\n"
        f"(time.perf_counter() - t) / {iters} * 1e6"
    )
    modes = ("unchecked", "checked", "unchecked again")  # the last: the control
    times: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(rounds):
        k = r % len(modes)
        for mode in modes[k:] + modes[:k]:
            result = session.run(code, check=mode == "checked")
            times[mode].append(max(float(result.result(i) or 0) for i in range(len(session.ranks))))
    return times


def stranger(session: distnb.Session, lan: Lan, rounds: int) -> dict[str, list[float]]:
    """The cell's wall time (s) with a stranger writing over every key for its first
    `ATTACK_S`, and alone."""
    assert session.control is not None
    modes = ("stranger", "alone", "alone again")  # the last: the control
    times: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(rounds):
        k = r % len(modes)
        for mode in modes[k:] + modes[:k]:
            writer = Stranger(lan.kernel_addr, session.control.port, session.control.session_id)
            if mode == "stranger":
                writer.keep_writing(ATTACK_S)
            started = time.perf_counter()
            session.run(LOOP)
            times[mode].append(time.perf_counter() - started)
            writer.stop()
    return times


def _cut(host: Host, when: list[float]) -> None:
    host.link(up=False)
    when.append(time.monotonic())


def lifeline(lan: Lan, repeats: int) -> list[float]:
    """Seconds from a host's cut until it runs no engine or nanny (see the module)."""
    h2, h3 = lan.hosts
    took = []
    for _ in range(repeats):
        session = distnb.start(
            hosts={h2.addr: 1, h3.addr: 3}, host=lan.kernel_addr, ssh_args=lan.ssh_args,
            progress=False,
        )  # fmt: skip
        cut: list[float] = []
        timer = threading.Timer(2.0, _cut, (h3, cut))
        timer.start()
        try:
            with contextlib.suppress(RankDiedError):  # the cut host's ranks left the cluster
                session.run(BUSY)
            timer.join()
            while h3.distnb_processes() and time.monotonic() - cut[0] < 120:
                time.sleep(0.1)
            took.append(time.monotonic() - cut[0])
        finally:
            h3.link(up=True)
            session.stop()
    return took


@contextlib.contextmanager
def per_engine() -> Iterator[None]:
    """distnb's ssh kind as it started engines before they were forked: ipyparallel's engine
    set, one ssh command per engine running distnb's engine (which imports torch)."""
    from ipyparallel.cluster.launcher import SSHEngineLauncher, SSHEngineSetLauncher

    class Engine(SSHEngineLauncher):  # type: ignore[misc]
        def get_env(self) -> dict[str, str]:
            return {**super().get_env(), LAUNCHED_ON_VAR: str(self.location)}

    class EngineSet(SSHEngineSetLauncher):  # type: ignore[misc]
        launcher_class = Engine

        def _notice_engine_stopped(self, data: dict[str, object]) -> None:
            if data["identifier"] in self.launchers:  # not one the stop took out
                super()._notice_engine_stopped(data)

    forked = ssh.Ssh.launcher, ssh.Ssh.launcher_settings
    settings = ssh.Ssh.launcher_settings
    ssh.Ssh.launcher = lambda self: EngineSet  # type: ignore[method-assign]
    ssh.Ssh.launcher_settings = lambda self: {  # type: ignore[method-assign]
        **settings(self),
        "engine_cmd": engine_command(self.python),
    }
    try:
        yield
    finally:
        ssh.Ssh.launcher, ssh.Ssh.launcher_settings = forked  # type: ignore[method-assign]


def hosts_pss_mb(lan: Lan) -> float:
    """The PSS of the hosts' engines, forkers and nannies, in MB."""
    total = 0
    for host in lan.hosts:
        for proc in host.distnb_processes():
            with contextlib.suppress(psutil.Error):
                total += proc.memory_full_info().pss
    return total / 1e6


def forked_starts(lan: Lan, ranks: int, repeats: int) -> dict[str, list[float]]:
    """Start times (s) and hosts' PSS (MB), forked and one ssh command per engine, the order
    rotating."""
    kinds = ("forked", "per engine")
    found: dict[str, list[float]] = {f"{k} {w}": [] for k in kinds for w in ("s", "MB")}
    for i in range(repeats):
        for kind in kinds[i % 2 :] + kinds[: i % 2]:
            with per_engine() if kind == "per engine" else contextlib.nullcontext():
                started = time.perf_counter()
                session = distnb.start(
                    hosts={h.addr: ranks for h in lan.hosts}, host=lan.kernel_addr,
                    ssh_args=lan.ssh_args, progress=False,
                )  # fmt: skip
                found[f"{kind} s"].append(time.perf_counter() - started)
                found[f"{kind} MB"].append(hosts_pss_mb(lan))
                session.stop()
    return found


@contextlib.contextmanager
def per_task() -> Iterator[None]:
    """distnb's Slurm kind as it started engines before they were forked: each task of srun
    runs distnb's engine (which imports torch)."""
    forked = slurm_kind._program
    slurm_kind._program = lambda launcher: engine_command(launcher.engine_cmd[0])
    try:
        yield
    finally:
        slurm_kind._program = forked


def slurm_forked_starts(lan: Lan, slurm: Slurm, ranks: int, repeats: int) -> dict[str, list[float]]:
    """Start times (s) and nodes' PSS (MB) of a Slurm job of 2 nodes of `ranks`, forked and one
    engine per task, the order rotating."""
    kinds = ("forked", "per task")
    found: dict[str, list[float]] = {f"{k} {w}": [] for k in kinds for w in ("s", "MB")}
    for i in range(repeats):
        for kind in kinds[i % 2 :] + kinds[: i % 2]:
            while slurm.jobs() or any(h.distnb_processes() for h in lan.hosts):
                time.sleep(0.2)  # the last job gone: this one does not queue behind it
            with per_task() if kind == "per task" else contextlib.nullcontext():
                started = time.perf_counter()
                session = distnb.start(
                    ranks * len(lan.hosts), engines="slurm", host=lan.kernel_addr,
                    slurm=["--ntasks-per-node", str(ranks)], progress=False,
                )  # fmt: skip
                found[f"{kind} s"].append(time.perf_counter() - started)
                found[f"{kind} MB"].append(hosts_pss_mb(lan))
                session.stop()
    return found


def _row(name: str, ours: list[float], peer: list[float] | None, unit: str, label: str) -> str:
    low, high = median_ci(ours)
    text = f"{name:34} {statistics.median(ours):9.3f} {unit} [{low:.3f}-{high:.3f}]"
    if peer is None:
        return text
    ratio, r_low, r_high = ratio_of_medians(ours, peer)
    return (
        f"{text}   {label} {statistics.median(peer):.3f} {unit}: "
        f"{ratio:.2f}x [{r_low:.2f}-{r_high:.2f}]"
    )


def starts(lan: Lan, engines: str, repeats: int) -> tuple[list[float], list[float], list[float]]:
    """(distnb's, the peer's, the peer's again) start times, the order rotating; the peer's
    second start in each repeat is the control."""
    ours: list[float] = []
    peer: list[float] = []
    again: list[float] = []
    kinds = ("distnb", "raw", "raw again")
    for i in range(repeats):
        k = i % len(kinds)
        for kind in kinds[k:] + kinds[:k]:
            if kind != "distnb":
                (peer if kind == "raw" else again).append(raw_start(lan, engines))
            else:
                elapsed, session = distnb_start(lan, engines)
                ours.append(elapsed)
                session.stop()
    return ours, peer, again


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--parts", nargs="+", choices=(*PARTS, *ALONE), default=list(PARTS))
    parser.add_argument("--ranks", type=int, nargs="+", default=[2], help="per host (forked)")
    return parser.parse_args()


def main(args: argparse.Namespace) -> None:
    if why := missing():
        sys.exit(f"bench_hosts needs {why}")
    by_ssh = times = attacked = ended = None
    forked: dict[int, dict[str, list[float]]] = {}
    slurm_forked: dict[int, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-hosts-") as state:
        lan = Lan(Path(state))
        try:
            lan.add_host("h2")
            lan.add_host("h3")
            if "start" in args.parts:
                by_ssh = starts(lan, "ssh", args.repeats)
            if "forked" in args.parts:
                for ranks in args.ranks:
                    forked[ranks] = forked_starts(lan, ranks, args.repeats)
            if "cost" in args.parts or "stranger" in args.parts:
                _, session = distnb_start(lan)
                with session:
                    if "cost" in args.parts:
                        times = cost(session, args.rounds, 200)
                    if "stranger" in args.parts:
                        attacked = stranger(session, lan, args.rounds)
            if "lifeline" in args.parts:
                ended = lifeline(lan, args.repeats)
            slurm = None if slurm_missing() or "slurm" not in args.parts else Slurm(lan, lan.hosts)
            if slurm is not None:
                os.environ.update(slurm.env, IPYTHONDIR=str(slurm.shared / "ipython"))
                try:
                    by_slurm = starts(lan, "slurm", args.repeats)
                finally:
                    slurm.close()
            if "slurm-forked" in args.parts and not slurm_missing():
                nodes = Slurm(lan, lan.hosts, cpus=max(args.ranks))
                os.environ.update(nodes.env, IPYTHONDIR=str(nodes.shared / "ipython"))
                try:
                    for ranks in args.ranks:
                        slurm_forked[ranks] = slurm_forked_starts(lan, nodes, ranks, args.repeats)
                finally:
                    nodes.close()
        finally:
            lan.close()
    ways = (  # heading, the peer's key and name, where the engines run
        (forked, "# 2 hosts x {} ranks, forked on each host against one ssh per engine",
         "per engine", "one ssh per engine", "hosts'"),
        (slurm_forked, "# a Slurm job, 2 nodes x {} tasks, forked on each node against a task each",
         "per task", "one engine per task", "nodes'"),
    )  # fmt: skip
    for results, heading, peer, peer_name, where in ways:
        for ranks, found in results.items():
            print(heading.format(ranks))
            for unit, what in (("s", "start to ready"), ("MB", f"{where} PSS, ready")):
                mine, theirs = found[f"forked {unit}"], found[f"{peer} {unit}"]
                print(_row(f"{what}, 2x{ranks} ({unit})", mine, theirs, unit, peer_name))
    if not forked and not slurm_forked:
        print(f"# 2 hosts x {RANKS_PER_HOST} ranks; the order of the starts rotates")
    label = "ipyparallel ssh + torch + gloo"
    if by_ssh is not None:
        print(_row("start to ready, ssh (s)", *by_ssh[:2], "s", label))
        print(_row("  control: the peer again (s)", *by_ssh[:0:-1], "s", label))
    if slurm is not None:
        label = "ipyparallel Slurm + torch + gloo"
        print(_row("start to ready, Slurm job (s)", *by_slurm[:2], "s", label))
        print(_row("  control: the peer again (s)", *by_slurm[:0:-1], "s", label))
    if times is not None:
        print(
            _row(
                "8-el all_reduce across hosts (us)",
                times["checked"],
                times["unchecked"],
                "us",
                "unchecked",
            )
        )
        print(
            _row(
                "  control: unchecked again (us)",
                times["unchecked again"],
                times["unchecked"],
                "us",
                "unchecked",
            )
        )
    if ended is not None:
        print(_row("cut host empty after the cut (s)", ended, None, "s", ""))
    if attacked is not None:
        print(
            _row(
                f"cell, stranger its first {ATTACK_S:g} s (s)",
                attacked["stranger"],
                attacked["alone"],
                "s",
                "alone",
            )
        )
        print(
            _row(
                "  control: alone again (s)",
                attacked["alone again"],
                attacked["alone"],
                "s",
                "alone",
            )
        )


if __name__ == "__main__":
    from results import saved

    parsed = arguments()
    alone = parsed.parts == ["forked"] or parsed.parts == ["slurm-forked"]
    with saved(f"hosts-{parsed.parts[0]}" if alone else "hosts"):
        main(parsed)
