"""Attaching without the agent: a job that did not opt in, read through its processes.

Ranks are found by their environment (`/proc/<pid>/environ`: torchrun gives each worker `RANK`,
`LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR`/`MASTER_PORT` and `TORCHELASTIC_RUN_ID`), on this
machine, and grouped into jobs (`TorchrunJob`: its launchers, the torchrun processes whose
children they are; its run id; its ranks). Their stacks come from py-spy
(`pip install distnb[attach]`, `stacks`), which reads a process's memory without stopping it,
native frames included, so a rank waiting in DDP's gradient all_reduce is seen there. What
stacks alone allow is said (`stack_verdicts`): which ranks sit in which collective at which
line, and which run elsewhere. What needs the agent (`python -m distnb.run`): the collective's
seq and shapes, which call a rank skipped, mismatches, circles across groups, stopping and
looking inside. Other hosts are searched by running this search there, over ssh (`remote`).
Python 3.14's `sys.remote_exec` could load the agent into a running process later; distnb
does not depend on it.
"""

from __future__ import annotations

import os
import socket
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil

from distnb.errors import ConfigError
from distnb.ranklist import format_ranks
from distnb.records.attach import AgentState, OpenCall, RankSnapshot, StackFrame
from distnb.records.collective import CallSite, Fingerprint
from distnb.session.attach.stacks import Sample, pyspy, read

__all__ = [
    "GAP_S",
    "NEEDS_AGENT",
    "TorchrunJob",
    "find_jobs",
    "find_ranks",
    "look",
    "looks_hung",
    "pyspy",
    "pyspy_stack",
    "stack_verdicts",
]

NEEDS_AGENT = (
    "Without the agent: stacks only. The seq and shapes of each collective, which call a rank "
    "skipped, mismatches, circles across groups, stopping ranks and looking inside need the "
    "agent: run the job with `python -m distnb.run` instead of `torchrun`."
)
GAP_S = 1.0  # between the two looks at every rank that tell a hung job from a running one
MOVED_CPU_S = 0.02  # CPU a rank outside any collective uses between them, if it runs


@dataclass(frozen=True, slots=True)
class TorchrunJob:
    """A torchrun job on this machine: its run id (`TORCHELASTIC_RUN_ID`), its launchers' pids
    (one per torchrun on this machine), the first one's command line and start (seconds since
    the epoch), its ranks here as (rank, pid), and its world size."""

    run: str
    launchers: tuple[int, ...]
    command: str
    started: float
    ranks: tuple[tuple[int, int], ...]
    world_size: int

    def __str__(self) -> str:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        pids = ", ".join(f"{r}: {p}" for r, p in self.ranks)
        launcher = ",".join(map(str, self.launchers))
        return f"launcher pid {launcher}, run {self.run}, started {at}, ranks (pid) {pids}: " + (
            self.command
        )


def pyspy_stack(pid: int) -> tuple[StackFrame, ...]:
    """The stack of process `pid` (its thread in a collective, else its main thread), outermost
    first; () without py-spy or access."""
    return read(pid).stack


def find_ranks(run: str | None = None) -> list[tuple[int, dict[str, str]]]:
    """(pid, environment) of every process on this machine that is a torchrun worker (of run
    `run`, its `TORCHELASTIC_RUN_ID`, where given), in rank order. A worker's children
    (DataLoader workers) inherit its environment: only the worker itself is kept."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        env = _environ(int(entry.name))
        worker = "RANK" in env and "TORCHELASTIC_RUN_ID" in env and "LOCAL_RANK" in env
        if worker and (run is None or env["TORCHELASTIC_RUN_ID"] == run):
            found[int(entry.name)] = env
    kept = [(pid, env) for pid, env in found.items() if _parent(pid) not in found]
    return sorted(kept, key=lambda pe: (int(pe[1]["RANK"]), pe[0]))


def find_jobs() -> list[TorchrunJob]:
    """The torchrun jobs on this machine, oldest first. Ranks belong to one job when they share
    its run id and its store (`MASTER_ADDR:MASTER_PORT`): two jobs started without `--rdzv-id`
    both have run id "none"."""
    groups: dict[tuple[str, str], list[tuple[int, dict[str, str]]]] = defaultdict(list)
    for pid, env in find_ranks():
        store = f"{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}"
        groups[(env["TORCHELASTIC_RUN_ID"], store)].append((pid, env))
    jobs = []
    for (run, _), members in groups.items():
        launchers = tuple(sorted({_parent(pid) for pid, _ in members}))
        command, started = _described(launchers[0])
        ranks = tuple((int(env["RANK"]), pid) for pid, env in members)
        world = int(members[0][1].get("WORLD_SIZE", "0"))
        jobs.append(TorchrunJob(run, launchers, command, started, ranks, world))
    return sorted(jobs, key=lambda j: (j.started, j.launchers))


def look(
    target: str | None = None, gap_s: float = GAP_S, jobs: Sequence[TorchrunJob] | None = None
) -> tuple[list[RankSnapshot], str]:
    """The ranks of one torchrun job on this machine, with their stacks, and why that job (""
    where there was no choice).

    The job is the one `target` names (a launcher's pid, a rank's pid, or the run id, as
    `find_jobs` lists them), else the only one here, else the only one that looks hung: every
    rank is looked at twice, `gap_s` apart, and a job looks hung when no rank of it moved in
    between while at least one waits in a collective (`looks_hung`). A job that runs moves; one
    that waits for a peer that never comes does not. Several or none: the jobs are listed in
    the error, with how to name one. `jobs`: the jobs to choose among (`find_jobs()`'s).
    """
    jobs = find_jobs() if jobs is None else jobs
    if not jobs:
        raise ConfigError(
            "no torchrun worker runs on this machine (none has RANK and TORCHELASTIC_RUN_ID "
            "in its environment)"
        )
    if target is not None or len(jobs) == 1:
        job = jobs[0] if target is None else named(jobs, target)
        return _snapshots(job, _read_all(job)), ""
    first = _read_all(*jobs)
    time.sleep(gap_s)
    second = _read_all(*jobs)
    hung = [j for j in jobs if looks_hung(_of(j, first), _of(j, second))]
    if len(hung) != 1:
        listed = "\n".join(f"  {'(looks hung) ' if j in hung else ''}{j}" for j in jobs)
        raise ConfigError(
            f"{len(jobs)} torchrun jobs run on this machine and {len(hung) or 'none'} of them "
            f"look hung (a rank waiting in a collective, no rank moving in {gap_s:g} s):\n"
            f"{listed}\nname one by its launcher pid or its run id: %dist_attach --no-agent "
            "PID (attach_processes('PID'))"
        )
    job = hung[0]
    others = "\n".join(f"  {j}" for j in jobs if j is not job)
    snaps = _snapshots(job, second)
    waiting = [s.rank for s in snaps if s.current is not None]
    why = (
        f"{len(jobs)} torchrun jobs run on this machine; this one (launcher pid "
        f"{','.join(map(str, job.launchers))}, run {job.run}) looks hung: "
        f"{format_ranks(waiting)} waited in a collective and no rank moved in {gap_s:g} s. "
        f"The others (%dist_attach --no-agent PID names one):\n{others}"
    )
    return snaps, why


def named(jobs: Sequence[TorchrunJob], target: str) -> TorchrunJob:
    """The job `target` names: a launcher's pid, a rank's pid, or its run id."""
    by_pid = [j for j in jobs if target.isdigit() and int(target) in j.launchers]
    by_pid += [j for j in jobs if target.isdigit() and int(target) in dict(j.ranks).values()]
    by_run = [j for j in jobs if j.run == target]
    found = by_pid or by_run
    if len(found) == 1:
        return found[0]
    listed = "\n".join(f"  {j}" for j in jobs)
    what = "several jobs have" if found else "no torchrun job here has"
    raise ConfigError(
        f"{what} the launcher pid, rank pid or run id {target!r}; the jobs here:\n{listed}\n"
        "name one by its launcher pid"
    )


def looks_hung(first: Sequence[Sample], second: Sequence[Sample]) -> bool:
    """Two looks at a job's ranks (in the same order): every rank was read both times, none
    moved, and at least one waits in a collective. A rank moved if its threads' frames changed,
    or if it used `MOVED_CPU_S` of CPU while not in a collective: a rank of a running job can be
    caught at the same line twice (a loop that sleeps at each step), but it computes in between;
    a rank in a collective may spin where it waits (NCCL), so its CPU says nothing."""

    def moved(a: Sample, b: Sample) -> bool:
        spent = b.cpu_s - a.cpu_s >= MOVED_CPU_S and b.wait is None
        return a.threads != b.threads or spent

    return (
        bool(second)
        and all(a.threads and not moved(a, b) for a, b in zip(first, second))
        and any(b.wait is not None for b in second)
    )


def _read_all(*jobs: TorchrunJob) -> dict[int, Sample]:
    """Every rank of `jobs`, by pid, read at once (py-spy is a process each)."""
    pids = [p for j in jobs for _, p in j.ranks]
    with ThreadPoolExecutor(max_workers=min(8, len(pids))) as pool:
        return dict(zip(pids, pool.map(read, pids)))


def _of(job: TorchrunJob, samples: dict[int, Sample]) -> list[Sample]:
    return [samples[p] for _, p in job.ranks]


def _snapshots(job: TorchrunJob, samples: dict[int, Sample]) -> list[RankSnapshot]:
    host = socket.gethostname()
    return [
        _snapshot(rank, host, pid, job.world_size, _local_rank(pid), samples[pid])
        for rank, pid in job.ranks
    ]


def _snapshot(rank: int, host: str, pid: int, world: int, local: int, s: Sample) -> RankSnapshot:
    """A rank as its stack shows it: in a collective (its op, where the user's code called in,
    the library code it came through), running outside any, or unknown (not read)."""
    state, current = AgentState.UNKNOWN, None
    if s.wait is not None:
        site = CallSite(s.wait.site.file, s.wait.site.line)
        # seq -1: without the agent no count of collectives is known; group "": nor the group
        fp = Fingerprint(rank, "", -1, s.wait.op, site=site, origin=s.wait.origin)
        current = OpenCall("", "", -1, s.wait.op, (), site, fingerprint=fp)
        state = AgentState.COLLECTIVE
    elif s.stack:
        state = AgentState.RUNNING
    return RankSnapshot(
        rank, host, pid, state, world, local, current=current, stack=s.stack, source="py-spy"
    )


def stack_verdicts(snaps: Sequence[RankSnapshot]) -> list[str]:
    """What stacks alone say: which ranks sit in which collective at which line (and through
    which library code: "all_reduce (DDP gradient bucket in backward)"), which run elsewhere
    (and where)."""
    inside: dict[str, list[int]] = defaultdict(list)
    outside: dict[str, list[int]] = defaultdict(list)
    for s in snaps:
        fp = s.current.fingerprint if s.current is not None else None
        python = [f for f in s.stack if f.line > 0]
        if s.current is not None:
            how = f" ({fp.origin})" if fp is not None and fp.origin else ""
            inside[f"{s.current.op}{how} at {s.current.site}"].append(s.rank)
        elif python:
            top = python[-1]
            outside[f"{top.file}:{top.line} in {top.function}"].append(s.rank)
    out = [
        f"{format_ranks(ranks)} {'sits' if len(ranks) == 1 else 'sit'} in {call}"
        for call, ranks in sorted(inside.items(), key=lambda kv: kv[1])
    ]
    if inside:
        out += [
            f"{format_ranks(ranks)} {'runs' if len(ranks) == 1 else 'run'} outside any "
            f"collective, at {where}"
            for where, ranks in sorted(outside.items(), key=lambda kv: kv[1])
        ]
    return out


def _environ(pid: int) -> dict[str, str]:
    try:
        return dict(psutil.Process(pid).environ())
    except psutil.Error:
        return {}


def _local_rank(pid: int) -> int:
    return int(_environ(pid).get("LOCAL_RANK", "-1"))


def _parent(pid: int) -> int:
    try:
        return int(psutil.Process(pid).ppid())
    except psutil.Error:
        return 0


def _described(pid: int) -> tuple[str, float]:
    """A process's command line and start time (seconds since the epoch); "" and 0 if gone."""
    try:
        p = psutil.Process(pid)
        return " ".join(p.cmdline()), float(p.create_time())
    except psutil.Error:
        return "", 0.0
