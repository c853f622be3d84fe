"""The attach agent's cost and speed, on real torchrun jobs (`tests/attach/train.py`, gloo, CPU).

1. Idle cost per training step: the same job under `python -m distnb.run` (the agent loaded,
   nobody attached) and under plain `torchrun`, rounds interleaved; each job reports its mean
   step time over its steps after the first 10; the ratio of medians with its 95% interval.
2. Status of every rank (`AttachedJob.status()`: states, stacks, verdicts) of a hung job of N
   ranks, against `py-spy dump` run on each rank's process in turn, in the same run.

    .venv/bin/python bench/bench_attach.py [--rounds 5] [--steps 300] [--ranks 4]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.median_ci import median_ci, ratio_of_medians
from tests.attach.jobs import job


def step_time(tmp: Path, agent: bool, steps: int) -> float:
    with job(tmp, "ok", agent=agent, STEPS=str(steps)) as jb:
        jb.finals(600)
        return statistics.mean(float(x) for x in re.findall(r"step_s (\S+)", jb.log.read_text()))


def idle_cost(rounds: int, steps: int) -> None:
    agent, plain = [], []
    with tempfile.TemporaryDirectory() as d:
        for _ in range(rounds):
            plain.append(step_time(Path(d), False, steps))
            agent.append(step_time(Path(d), True, steps))
    ratio, lo, hi = ratio_of_medians(agent, plain)
    print(f"step, agent loaded:  median {statistics.median(agent) * 1e3:.3f} ms")
    print(f"step, plain torchrun: median {statistics.median(plain) * 1e3:.3f} ms")
    print(f"idle cost: {ratio:.3f}x [{lo:.3f}, {hi:.3f}] ({rounds} rounds, {steps} steps each)")


def status_speed(ranks: int, rounds: int) -> None:
    import distnb
    from distnb.session.attach import procs

    with (
        tempfile.TemporaryDirectory() as d,
        job(Path(d), "hang", n=ranks, STEPS="8", SKIP_AT="3") as jb,
    ):
        while not (jb.folder / "endpoint.json").exists():
            time.sleep(0.1)
        j = distnb.attach(str(jb.folder), timeout=120)
        while not any(v.startswith("rank 1 runs") for v in j.verdicts()):
            time.sleep(0.2)
        pids = [s.pid for s in j.snapshots()]
        ours, spy = [], []
        for _ in range(rounds):
            t = time.perf_counter()
            view = j.status()
            ours.append(time.perf_counter() - t)
            assert view.verdicts
            t = time.perf_counter()
            for pid in pids:
                subprocess.run([procs.pyspy() or "py-spy", "dump", "--pid", str(pid)],
                               capture_output=True, check=True)  # fmt: skip
            spy.append(time.perf_counter() - t)
        j.detach()
    ratio, lo, hi = ratio_of_medians(ours, spy)
    print(f"{ranks} ranks: status with verdicts {statistics.median(ours) * 1e3:.0f} ms "
          f"{[round(x * 1e3) for x in median_ci(ours)]}, py-spy dump of each process "
          f"{statistics.median(spy) * 1e3:.0f} ms; ratio {ratio:.2f}x [{lo:.2f}, {hi:.2f}]")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--ranks", type=int, default=4)
    args = parser.parse_args()
    idle_cost(args.rounds, args.steps)
    status_speed(args.ranks, 2 * args.rounds)
