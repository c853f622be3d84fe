"""How soon distnb names a fault, on real processes killed with real signals.

    python bench/bench_faults.py [--rounds 9]

Every trial runs once per round, in an order that rotates from round to round; one that leaves
the cluster broken restarts it (untimed), the others go on with the same session. Times are
measured in this process (which plays the kernel), each from the fault to what names it:

- rank in a loop: both ranks run 8-element `all_reduce`s in a loop; rank 1's engine is
  SIGKILLed after its 100th. Until `session.run` raises `RankDiedError` naming rank 1's pid.
- rank, peer waiting: rank 1 computes (sleeps) while rank 0 waits for it at an `all_reduce`;
  rank 1 is SIGKILLed once rank 0's beacon says it waits. Until `RankDiedError`.
- controller / heart monitor / rank 1's nanny: SIGKILLed while rank 0 waits at an
  `all_reduce`. Until the `SessionError` that names it.
- kernel: a Python process that ran `distnb.start(2)` and then a cell in which rank 0 waits at
  an `all_reduce` is SIGKILLed. Until every process below it has ended (their pidfds; the
  reaper's work), and none carries the cluster's mark.
- rank ends the cell: rank 1 ends the cell without calling the `all_reduce` rank 0 waits at.
  From rank 1's last line (its stamp of the monotonic clock, which every process on a Linux
  host shares) until `CollectiveDesyncError`. Plain gloo's rank 0 would wait for its process
  group's timeout (torch's default: 30 min); that is stated, not waited out.
- rank never arrives: rank 1 sleeps, rank 0 waits; nothing tells that from a slow rank, so it
  is the cell's timeout (1 s here) that ends it. From the call until `RankTimeoutError` (the
  hang report with each rank's stack).
- torchrun: the guide's small DDP script (`init_process_group`, a DDP Linear, 4 steps,
  `destroy_process_group`) under `torchrun --standalone --nproc-per-node 2` (process starts,
  imports, rendezvous, exit), against `session.run_script` (`%dist_run`) on a running session:
  the first run on freshly started ranks, and the median of 3 runs after it; then 3 more runs
  on the running session, the control of the ratio (`%dist_run` against itself). A torchrun
  run that fails with gloo's exit-time abort ("terminate called without an active exception",
  torch 2.13) is run again and counted.

Each row: the median over rounds, the 95% confidence interval of that median (order statistics;
9 rounds, the default, are the fewest for which it is narrower than the range at both ends) and
the lowest and highest time. torchrun / `%dist_run` is
a ratio of medians with its paired-bootstrap interval. At the end every process started is
checked gone (psutil), and no process carries the mark of any cluster the bench started.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from median_ci import median_ci, ratio_of_medians
from results import saved
from torchrun_timed import torchrun_seconds

import distnb
from distnb.errors import CollectiveDesyncError, RankDiedError, RankTimeoutError, SessionError
from distnb.reaper import MARK_VAR, marked
from distnb.session.cluster.members import Role

WAITS = "import time\nx = torch.ones(1)\nif rank == 1:\n    time.sleep(60)\ndist.all_reduce(x)\n"
LOOP = (
    "x = torch.zeros(8)\nfor i in range(10**9):\n    dist.all_reduce(x)\n"
    "    if i == 100 and rank == 1:\n        open({mark!r}, 'w').close()\n"
)
ENDS = (
    "import time\nx = torch.ones(1)\nif rank == 0:\n    dist.all_reduce(x)\nelse:\n"
    "    time.sleep(0.2)\n    open({stamp!r}, 'w').write(repr(time.monotonic()))\n"
)
KERNEL = (
    "import distnb\ns = distnb.start(2, progress=False)\nprint('started', flush=True)\n"
    "s.run({cell!r})\n"
)
KERNEL_CELL = (
    "import pathlib, time\nx = torch.ones(1)\npathlib.Path({mark!r} + str(rank)).touch()\n"
    "if rank == 1:\n    time.sleep(600)\ndist.all_reduce(x)\n"
)
SCRIPT = """\
import argparse
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        loss = model(torch.full((2, 4), float(rank + step))).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        print(f"step {step}: loss {total.item():.5f}")
    print("weights", [round(p.sum().item(), 5) for p in model.parameters()])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""
ROWS = {
    "loop": "rank 1 SIGKILLed in an all_reduce loop -> RankDiedError",
    "waited": "rank 1 SIGKILLed, rank 0 waiting for it -> RankDiedError",
    "controller": "controller SIGKILLed, rank 0 waiting -> SessionError",
    "heart": "heart monitor SIGKILLed, rank 0 waiting -> SessionError",
    "nanny": "rank 1's nanny SIGKILLed, rank 0 waiting -> SessionError",
    "kernel": "kernel SIGKILLed mid-cell -> all its processes gone",
    "ends": "rank 1 ends the cell, rank 0 waiting -> CollectiveDesyncError",
    "never": "rank 1 never arrives, timeout=1 -> RankTimeoutError",
    "torchrun": "torchrun --standalone, 2 ranks: DDP script",
    "cold": "%dist_run, same script: first run after start",
    "warm": "%dist_run, same script: running session",
    "warm again": "%dist_run, same script: running session, again (the control)",
}


class Bench:
    """The shared session, the times so far, and every pid and mark the bench has started."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.times: dict[str, list[float]] = {key: [] for key in ROWS}
        self.pids: set[int] = set()
        self.marks: set[str] = set()
        self.reruns = 0  # torchrun runs lost to gloo's exit-time abort
        self.members = 0  # processes below the killed kernel
        self.script = folder / "train.py"
        self.script.write_text(SCRIPT)
        self.s = distnb.start(2, progress=False)
        self.fresh = True  # no script has run on these ranks yet
        self.note()
        assert self.s.call(os.getpid) == [r.pid for r in self.s.ranks]

    def note(self) -> None:
        assert self.s.cluster is not None
        self.pids.update(self.s.pids())
        self.marks.add(self.s.cluster.mark)

    def restart(self) -> None:
        self.s.restart()
        self.fresh = True
        self.note()

    def pid(self, role: Role) -> int:
        assert self.s.cluster is not None
        if role is Role.ENGINE:
            return self.s.ranks[1].pid
        self.s.cluster.members.track()  # a nanny may start after its engine registered
        members = [m for m in self.s.cluster.members if m.role is role]
        if role is Role.NANNY:  # rank 1's
            members = [m for m in members if m.parent == self.s.ranks[1].pid]
        (member,) = members
        return member.pid

    def waiting(self, rank: int) -> Callable[[], bool]:
        """True once `rank` waits at a checked collective in the next run (its beacon)."""
        run_id, control = self.s.runs + 1, self.s.control
        assert control is not None
        return lambda: any(b.waiting and b.run_id == run_id for b in control.beacons([rank]))


class Killer:
    """SIGKILLs `pid` from a thread of this process once `ready()` holds, noting when."""

    def __init__(self, pid: int, ready: Callable[[], bool]) -> None:
        self.at = 0.0
        self._thread = threading.Thread(target=self._kill, args=(pid, ready), daemon=True)
        self._thread.start()

    def _kill(self, pid: int, ready: Callable[[], bool]) -> None:
        deadline = time.perf_counter() + 30
        while not ready():
            if time.perf_counter() > deadline:
                return
            time.sleep(0.002)
        self.at = time.perf_counter()
        os.kill(pid, signal.SIGKILL)

    def since(self, then: float) -> float:
        self._thread.join(5)
        assert self.at, "the process was never killed: its cue did not come"
        return then - self.at


def named(b: Bench, code: str, role: Role, ready: Callable[[], bool], said: str) -> float:
    """Run `code`; kill the `role` process once `ready()`; the time until the error names it."""
    pid = b.pid(role)
    killer = Killer(pid, ready)
    expected = RankDiedError if role is Role.ENGINE else SessionError
    try:
        b.s.run(code, timeout=60)
    except expected as err:
        raised = time.perf_counter()
        assert said.format(pid=pid) in str(err), str(err)
    else:
        raise AssertionError(f"{role.value} was killed and the cell ended without an error")
    took = killer.since(raised)
    b.restart()
    return took


def rank_in_loop(b: Bench) -> None:
    mark = b.folder / f"loop-{time.monotonic_ns()}"
    said = "rank 1 (pid {pid} on"
    took = named(b, LOOP.format(mark=str(mark)), Role.ENGINE, mark.exists, said)
    b.times["loop"].append(took)


def rank_waited_for(b: Bench) -> None:
    said = "rank 1 (pid {pid} on"
    b.times["waited"].append(named(b, WAITS, Role.ENGINE, b.waiting(0), said))


def controller(b: Bench) -> None:
    said = "controller (pid {pid}) was killed by SIGKILL"
    b.times["controller"].append(named(b, WAITS, Role.CONTROLLER, b.waiting(0), said))


def heart(b: Bench) -> None:
    said = "heart monitor (pid {pid}) died"
    b.times["heart"].append(named(b, WAITS, Role.HEART, b.waiting(0), said))


def nanny(b: Bench) -> None:
    said = "rank 1's nanny (pid {pid}"
    b.times["nanny"].append(named(b, WAITS, Role.NANNY, b.waiting(0), said))


def rank_ends_cell(b: Bench) -> None:
    stamp = b.folder / f"ends-{time.monotonic_ns()}"
    try:
        b.s.run(ENDS.format(stamp=str(stamp)), timeout=60)
    except CollectiveDesyncError as err:
        raised = time.monotonic()
        assert "rank 1 finished the cell without calling all_reduce" in str(err), str(err)
    else:
        raise AssertionError("rank 1 skipped the all_reduce and no desync was raised")
    b.times["ends"].append(raised - float(stamp.read_text()))
    works(b)


def rank_never_arrives(b: Bench) -> None:
    started = time.perf_counter()
    try:
        b.s.run(WAITS, timeout=1.0)
    except RankTimeoutError as err:
        took = time.perf_counter() - started
        assert "waiting at" in str(err.reports[0].detail), err.reports
        assert "time.sleep(60)" in err.reports[1].stack, err.reports
    else:
        raise AssertionError("rank 1 never arrived and the cell ended without a timeout")
    b.times["never"].append(took)
    works(b)


def works(b: Bench) -> None:
    """The session goes on after the fault: a collective gives the right answer."""
    assert b.s.run("x = torch.ones(1)\ndist.all_reduce(x)\nx.item()").result(0) == "2.0"


def kernel_killed(b: Bench) -> None:
    """A kernel that started a session dies mid-cell: how soon its processes are all gone."""
    mark = str(b.folder / f"kernel-{time.monotonic_ns()}-")
    code = KERNEL.format(cell=KERNEL_CELL.format(mark=mark))
    kernel = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert kernel.stdout is not None and kernel.stdout.readline().strip() == "started"
        deadline = time.monotonic() + 60
        while not all(Path(f"{mark}{r}").exists() for r in (0, 1)):
            assert time.monotonic() < deadline and kernel.poll() is None, "the cell never ran"
            time.sleep(0.01)
        below = psutil.Process(kernel.pid).children(recursive=True)
        b.pids.update(p.pid for p in below)
        cluster = cluster_mark(below)
        b.marks.add(cluster)
        fds = pidfds([p.pid for p in below])
        killed = time.perf_counter()
        kernel.kill()
        wait_all_readable(fds)
        b.times["kernel"].append(time.perf_counter() - killed)
        b.members = len(below)
        assert not marked(cluster), "a process of the dead kernel's cluster is still running"
    finally:
        with contextlib.suppress(ProcessLookupError):
            kernel.kill()
        kernel.wait()


def cluster_mark(procs: list[psutil.Process]) -> str:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if MARK_VAR in (env := proc.environ()):
                return str(env[MARK_VAR])
    raise AssertionError("no process below the kernel carries distnb's mark")


def pidfds(pids: list[int]) -> list[int]:
    """A pidfd for each process that still runs: readable once it has ended, all its threads
    included (a zombie is a process that has ended)."""
    fds = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            fds.append(os.pidfd_open(pid))
    return fds


def wait_all_readable(fds: list[int], timeout_s: float = 30) -> None:
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    pending = set(fds)
    deadline = time.monotonic() + timeout_s
    while pending:
        left_ms = (deadline - time.monotonic()) * 1e3
        assert left_ms > 0, f"{len(pending)} processes of the killed kernel still run"
        for fd, _ in poller.poll(left_ms):
            poller.unregister(fd)
            pending.discard(fd)
            os.close(fd)


def torchrun(b: Bench) -> None:
    if not b.fresh:
        b.restart()  # the first run is timed on ranks that have not run the script yet
    b.times["cold"].append(run_script(b))
    b.fresh = False
    b.times["warm"].append(statistics.median(run_script(b) for _ in range(3)))
    b.times["torchrun"].append(under_torchrun(b))
    b.times["warm again"].append(statistics.median(run_script(b) for _ in range(3)))


def run_script(b: Bench) -> float:
    out = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out):  # the ranks' output, shown as in a notebook
        b.s.run_script(str(b.script), "--steps 4")
    took = time.perf_counter() - started
    assert "weights" in out.getvalue(), out.getvalue()
    return took


def under_torchrun(b: Bench) -> float:
    took, lost = torchrun_seconds(b.script)
    b.reruns += lost
    return took


TRIALS = (
    rank_in_loop,
    rank_waited_for,
    controller,
    heart,
    nanny,
    kernel_killed,
    rank_ends_cell,
    rank_never_arrives,
    torchrun,
)


def report(b: Bench, rounds: int) -> None:
    print(f"{'fault -> what names it (s)':64} {'median':>7} {'95% CI':>15} {'min-max':>15}")
    for key, label in ROWS.items():
        times = b.times[key]
        low, high = median_ci(times)
        if key == "kernel":
            label = label.replace("all its", f"its {b.members}")
        print(
            f"{label:64} {statistics.median(times):7.3f} {low:7.3f}-{high:<7.3f} "
            f"{min(times):7.3f}-{max(times):.3f}"
        )
    ratio, low, high = ratio_of_medians(b.times["torchrun"], b.times["warm"])
    print(f"torchrun / %dist_run on a running session: {ratio:.0f}x [95% CI {low:.0f}-{high:.0f}]")
    ratio, low, high = ratio_of_medians(b.times["warm again"], b.times["warm"])
    print(f"control, %dist_run again / %dist_run: {ratio:.2f}x [95% CI {low:.2f}-{high:.2f}]")
    runs = rounds + b.reruns
    print(f"torchrun runs lost to gloo's exit-time abort and run again: {b.reruns} of {runs}")
    print(
        "plain gloo, rank 1 never arriving: rank 0 waits for the group's timeout, "
        "torch's default 1800 s (not waited out)"
    )


def cleanup(b: Bench) -> None:
    """Stop the session; every process the bench started, and every marked one, must be gone."""
    b.pids.update(b.s.pids())
    b.s.stop()
    below = {p.pid for p in psutil.Process().children(recursive=True)}
    left = [pid for pid in sorted(b.pids | below) if runs(pid)]
    left += [pid for mark in b.marks for pid in marked(mark)]
    print(f"cleanup: {len(b.pids)} processes started in {len(b.marks)} clusters, {len(left)} left")
    assert not left, f"still running: {left}"


def runs(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def main() -> None:

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    with saved("faults"):
        run(args.rounds)


def run(rounds: int) -> None:
    print("# gloo on loopback, 2 ranks")
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as folder:
        b = Bench(Path(folder))
        try:
            for r in range(rounds):
                shift = r % len(TRIALS)
                for trial in TRIALS[shift:] + TRIALS[:shift]:  # each goes first in turn
                    trial(b)
        finally:
            cleanup(b)
    print(f"# {rounds} rounds, each trial once per round in rotating order")
    report(b, rounds)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
