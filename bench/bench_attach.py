"""What attaching costs and how fast it answers, on real torchrun jobs (gloo, CPU).

    python bench/bench_attach.py [--rounds 10] [--steps 300] [--ranks 2 4] [--only PART]

1. **Idle cost per training step.** The same job (`bench/attach_job.py`, 2 ranks) under plain
   torchrun (`python -m torch.distributed.run`), under `python -m distnb.run` (every rank runs
   distnb's agent: the recorder at every collective, its serving thread; nobody attached), and
   under plain torchrun again (the control: its ratio to the first is the noise floor). The
   three take turns in each round, each in every place of the order in turn. Each job prints
   each rank's mean step time over its timed steps; a job's figure is its slowest rank's. Two
   workloads: `tiny`, a step that is almost only two small `dist.all_reduce`s (the worst case:
   the agent's cost is per collective), and `mlp`, a small DDP MLP (its bucket all_reduced by
   DDP's reducer, from C++, plus one metric all_reduce).
2. **Time to the first verdict.** A job of N ranks that hangs (`harness/train.py`, MODE
   hang: rank 1 skipped an all_reduce, rank 0 waits in its last one): from `distnb.attach(run
   folder)` to `verdicts()` returning the sentence that names the skipped call and both lines,
   attached afresh each round.
3. **Stacks of every rank.** On the same hung job: `snapshots()` (every rank's state and live
   Python stack, one request to all agents at once), against `py-spy dump` run on each rank's
   process in turn, and against N `py-spy dump`s started at once; the three take turns.
4. **A cold attach.** On the same hung job (2 ranks): a fresh interpreter (a real IPython shell
   in a process of its own, started anew each round) runs `%load_ext distnb`, then
   `%dist_attach RUN` (the attach and the status it shows: states, stacks, verdicts), each
   timed; the figure is `%dist_attach`'s, and both together. Two ways take turns: distnb's own
   (its torch-free client of the job's store, `distnb.contract.storewire`) and torch's client
   (`TCPStore` + `PrefixStore` + `SignedStore`, as `Link.client` was: the kernel imported torch
   to attach), each first in every other round. `--only idle|verdict|cold`: one part.

Printed times are medians over rounds with their 95% interval (`median_ci`); ratios are the
quotient of two medians with a 95% interval from a paired bootstrap over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from median_ci import median_ci, ratio_of_medians
from results import saved

from harness.jobs import job

JOB = Path(__file__).with_name("attach_job.py")
VARIANTS = ("plain", "agent", "again")


def ms(values: list[float]) -> str:
    lo, hi = median_ci(values)
    return f"{statistics.median(values) * 1e3:8.2f} [{lo * 1e3:.2f}-{hi * 1e3:.2f}]"


def ratio(values: list[float], base: list[float]) -> str:
    r, lo, hi = ratio_of_medians(values, base)
    return f"{r:.3f}x [{lo:.3f}-{hi:.3f}]"


def step_time(tmp: Path, variant: str, work: str, steps: int, tries: int = 3) -> float:
    """The slowest rank's mean step time in one job. A job that fails before both ranks have
    printed their times is said, with the lines of its log that say why, and run again (up to
    `tries` in all). Here a gloo worker sometimes aborts at its exit, after its times, with or
    without the agent ("terminate called without an active exception", in torch's teardown):
    such a job's times stand, and the line says so."""
    import re

    agent = variant == "agent"
    for attempt in range(1, tries + 1):
        with job(tmp, work, agent=agent, script=JOB, WORK=work, STEPS=str(steps)) as jb:
            jb.proc.wait(timeout=600)
            text = jb.log.read_text()
        found = [float(x) for x in re.findall(r"step_s (\d+\.\d{9})", text)]
        if len(found) == 2:  # timed; a crash in the teardown after it is said, not hidden
            if jb.proc.returncode != 0:
                last = [line for line in text.splitlines() if "terminate called" in line][:1]
                print(f"# {work} {variant}: timed, then exit {jb.proc.returncode} at the end "
                      f"({''.join(last) or 'see the log'})", flush=True)  # fmt: skip
            return max(found)
        why = [line for line in text.splitlines() if re.search(r"rror|exitcode|Signal", line)]
        print(f"# {work} {variant}: job {attempt} failed (exit {jb.proc.returncode}): "
              f"{' | '.join(why[:3])[:300]}", flush=True)  # fmt: skip
    raise RuntimeError(f"{work} {variant}: {tries} jobs failed; the last log:\n{text[-2000:]}")


def idle_cost(rounds: int, steps: int) -> None:
    print(f"# idle cost: 2 ranks, {rounds} rounds, {steps} steps per job ({20} untimed)")
    print(f"{'workload':<8} {'plain ms [95%]':>22} {'agent ms [95%]':>22}  "
          f"{'agent/plain [95%]':<22} control (again/plain)")  # fmt: skip
    for work in ("tiny", "mlp"):
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        with tempfile.TemporaryDirectory() as d:
            for i in range(rounds):
                order = VARIANTS[i % 3 :] + VARIANTS[: i % 3]
                for variant in order:
                    times[variant].append(step_time(Path(d), variant, work, steps))
        plain, agent, again = times["plain"], times["agent"], times["again"]
        print(f"{work:<8} {ms(plain):>22} {ms(agent):>22}  {ratio(agent, plain):<22} "
              f"{ratio(again, plain)}", flush=True)  # fmt: skip


def hung_job(ranks: int, measure: Callable[[Path, list[int]], None]) -> None:
    """A job of `ranks` ranks hung as the attach tests' is; `measure(run folder, pids)`."""
    import distnb
    from distnb.records.attach import AgentState

    with tempfile.TemporaryDirectory() as d, job(Path(d), "hang", n=ranks, STEPS="8",
                                                 SKIP_AT="3") as jb:  # fmt: skip
        jb.wait_for(r"final 1 ", timeout_s=600)
        j = distnb.attach(str(jb.folder), timeout=600)
        deadline = time.monotonic() + 600
        while True:  # every rank but 1 in its last all_reduce
            snaps = j.snapshots(10.0)
            waiting = [s for s in snaps if s.state is AgentState.COLLECTIVE]
            if len(waiting) == ranks - 1 and all(s.current.seq == 15 for s in waiting):
                break
            assert time.monotonic() < deadline, [(s.rank, s.state) for s in snaps]
            time.sleep(0.2)
        pids = [s.pid for s in snaps]
        j.detach()
        measure(jb.folder, pids)


def first_verdict(ranks: int, rounds: int) -> None:
    import distnb

    def measure(folder: Path, pids: list[int]) -> None:
        times = []
        for _ in range(rounds):
            t = time.perf_counter()
            j = distnb.attach(str(folder))
            verdicts = j.verdicts()
            times.append(time.perf_counter() - t)
            assert any("rank 1 skipped all_reduce #7" in v for v in verdicts), verdicts
            j.detach()
        print(f"{ranks:>5} {ms(times):>22}", flush=True)

    hung_job(ranks, measure)


def stacks(ranks: int, rounds: int) -> None:
    import distnb
    from distnb.session.attach import procs

    spy = procs.pyspy()
    assert spy is not None, "pip install 'distnb[attach]' (py-spy)"

    def in_turn(pids: list[int]) -> None:
        for pid in pids:
            subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, check=True)

    def at_once(pids: list[int]) -> None:
        running = [subprocess.Popen([spy, "dump", "--pid", str(pid)], stdout=subprocess.DEVNULL)
                   for pid in pids]  # fmt: skip
        assert all(p.wait() == 0 for p in running)

    def measure(folder: Path, pids: list[int]) -> None:
        j = distnb.attach(str(folder))
        ways: dict[str, Callable[[], object]] = {
            "agent": lambda: j.snapshots(),
            "in turn": lambda: in_turn(pids),
            "at once": lambda: at_once(pids),
        }
        times: dict[str, list[float]] = {w: [] for w in ways}
        names = list(ways)
        for i in range(rounds):
            for name in names[i % 3 :] + names[: i % 3]:
                t = time.perf_counter()
                ways[name]()
                times[name].append(time.perf_counter() - t)
        assert all(s.stack for s in j.snapshots())
        j.detach()
        agent = times["agent"]
        print(f"{ranks:>5} {ms(agent):>22} {ms(times['in turn']):>22} "
              f"{ms(times['at once']):>22}  {ratio(times['in turn'], agent):<22} "
              f"{ratio(times['at once'], agent)}", flush=True)  # fmt: skip

    hung_job(ranks, measure)


# A fresh kernel's side (`cold_attach`): argv = run folder, way. The import of the attach
# package is timed with the attach in both ways (the magic imports it lazily).
COLD = textwrap.dedent(
    """
    import json, sys, time
    from datetime import timedelta
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython()
    t = time.perf_counter()
    ip.run_line_magic("load_ext", "distnb")
    loaded = time.perf_counter()
    from distnb.session.attach.link import Link

    if sys.argv[2] == "torch":  # the kernel's client as it was: torch's own
        def client(self):
            import torch.distributed as dist
            from distnb.contract.signed import SignedStore

            e, timeout = self.endpoint, timedelta(seconds=self._timeout_s)
            raw = dist.TCPStore(e.host, e.port, is_master=False, timeout=timeout)
            return SignedStore(dist.PrefixStore(e.run, raw), self._secret)

        Link.client = client
    view = ip.run_line_magic("dist_attach", sys.argv[1])
    done = time.perf_counter()
    assert "2 ranks" in repr(view), repr(view)
    ip.run_line_magic("dist_attach", "--detach")
    print(json.dumps({"load_ext": loaded - t, "attach": done - loaded,
                      "torch": "torch" in sys.modules}))
    """
)
COLD_WAYS = ("wire", "torch")


def cold_attach(rounds: int) -> None:
    def once(folder: Path, way: str) -> dict[str, float]:
        env = {**os.environ, "DISTNB_RUNS": str(folder.parent)}
        out = subprocess.run([sys.executable, "-c", COLD, str(folder), way], env=env,
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        found = json.loads(out.strip().splitlines()[-1])
        assert found["torch"] == (way == "torch"), (way, found)
        return found

    def measure(folder: Path, pids: list[int]) -> None:
        times: dict[str, list[dict[str, float]]] = {w: [] for w in COLD_WAYS}
        for i in range(rounds):
            for way in COLD_WAYS[i % 2 :] + COLD_WAYS[: i % 2]:
                times[way].append(once(folder, way))
        attach = {w: [t["attach"] for t in times[w]] for w in COLD_WAYS}
        for way in COLD_WAYS:
            both = [t["load_ext"] + t["attach"] for t in times[way]]
            print(f"{way:<6} {ms([t['load_ext'] for t in times[way]]):>24} "
                  f"{ms(attach[way]):>24} {ms(both):>24}", flush=True)  # fmt: skip
        print(f"# torch/wire, %dist_attach: {ratio(attach['torch'], attach['wire'])}")

    hung_job(2, measure)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--only", choices=["idle", "verdict", "cold"], default=None)
    args = parser.parse_args()
    with saved("attach" if args.only is None else f"attach-{args.only}"):
        if args.only in (None, "idle"):
            idle_cost(args.rounds, args.steps)
        if args.only in (None, "verdict"):
            print(f"# time to the first verdict on a hung job: {args.rounds} rounds, "
                  "attached afresh each round (attach + verdicts)")  # fmt: skip
            print(f"{'ranks':>5} {'ms [95%]':>22}")
            for n in args.ranks:
                first_verdict(n, args.rounds)
            print(f"# stacks of every rank on the same hung job: {args.rounds} rounds, the "
                  "three ways in turn")  # fmt: skip
            print(f"{'ranks':>5} {'agent ms [95%]':>22} {'py-spy in turn ms':>22} "
                  f"{'py-spy at once ms':>22}  {'in turn/agent':<22} at once/agent")  # fmt: skip
            for n in args.ranks:
                stacks(n, args.rounds)
        if args.only in (None, "cold"):
            print(f"# a cold attach to the same hung job (2 ranks): {args.rounds} rounds, a fresh "
                  "interpreter each, the two ways in turn")  # fmt: skip
            print(f"{'client':<6} {'%load_ext ms [95%]':>24} {'%dist_attach ms [95%]':>24} "
                  f"{'both ms [95%]':>24}")  # fmt: skip
            cold_attach(args.rounds)


if __name__ == "__main__":
    main()
