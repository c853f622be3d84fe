"""What the attach agent adds to each collective, in CPU time: the figure its idle cost follows.

    python bench/bench_agent_call.py [--rounds 15] [--calls 3000]

The agent's cost on a training step is per collective (`distnb.rank.agent.tape`: a describe,
a stack walk for the call site, a list in a ring); nothing else runs on a rank's main thread
while nobody is attached. Timing whole jobs (`bench_attach.py --only idle`) puts that cost
inside two noisy step times; on a loaded 2-core machine their intervals hold it whatever it is.
CPU time of the calling thread is steadier: here one process makes a gloo group of one rank and
times `calls` 8-element `dist.all_reduce`s by `time.thread_time()`, in rounds that rotate:

- plain: torch without distnb;
- agent: the agent's recorder installed as `python -m distnb.run` installs it (the interceptor
  with the tape, and the process group's methods wrapped);
- again: plain once more, the noise floor.

It prints the CPU time per call of each (medians over rounds, 95% intervals) and the agent's
extra microseconds per collective, from which a step's ratio follows: a step of S ms with k
collectives pays k * extra / S. The ratio is also printed for a few steps (an assumption about
the user's job, not a measurement of one).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from median_ci import median_ci
from results import saved

VARIANTS = ("plain", "agent", "again")
STEPS = ((2, 1.0), (2, 5.0), (4, 20.0))  # (collectives, step ms): what the last lines assume


def per_call(calls: int) -> float:
    """CPU seconds of this thread per 8-element all_reduce."""
    import torch
    import torch.distributed as dist

    x = torch.ones(8)
    for _ in range(50):  # warm
        dist.all_reduce(x)
    t0 = time.thread_time()
    for _ in range(calls):
        dist.all_reduce(x)
    return (time.thread_time() - t0) / calls


def with_agent(calls: int) -> float:
    from distnb.rank.agent.entries import GroupMethods
    from distnb.rank.agent.tape import Tape
    from distnb.rank.checked.intercept import Interceptor

    tape, interceptor = Tape(0), Interceptor()
    interceptor.install(tape.record, tape.record)
    methods = GroupMethods(interceptor)
    try:
        took = per_call(calls)
        assert tape.recorder.count >= calls, "the agent's tape recorded nothing"
        return took
    finally:
        methods.restore()
        interceptor.uninstall()


def us(values: list[float]) -> str:
    lo, hi = median_ci(values)
    return f"{statistics.median(values) * 1e6:.2f} [{lo * 1e6:.2f}-{hi * 1e6:.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with saved("agent-call"):
        print(f"# CPU time of the calling thread per 8-element all_reduce, gloo, 1 rank; "
              f"{args.rounds} rounds of {args.calls} calls per variant, order rotated")  # fmt: skip
        for i in range(args.rounds):
            for variant in VARIANTS[i % 3 :] + VARIANTS[: i % 3]:
                run = with_agent if variant == "agent" else per_call
                times[variant].append(run(args.calls))
        for variant in VARIANTS:
            print(f"{variant:<6} us per call {us(times[variant])}")
        extra = [a - p for a, p in zip(times["agent"], times["plain"], strict=True)]
        control = [a - p for a, p in zip(times["again"], times["plain"], strict=True)]
        print(f"agent - plain: {us(extra)} us per collective; control (again - plain): "
              f"{us(control)} us")  # fmt: skip
        for k, step_ms in STEPS:
            cost = 1 + k * statistics.median(extra) / (step_ms / 1e3)
            print(f"a step of {step_ms:g} ms with {k} collectives would take {cost:.4f}x")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
