"""Attaching without the agent: a job that did not opt in, read through its processes.

Ranks are found by their environment (`/proc/<pid>/environ`: torchrun gives each worker `RANK`,
`LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR`/`MASTER_PORT` and `TORCHELASTIC_RUN_ID`), on this
machine. Their stacks come from py-spy (`pip install distnb[attach]`), which reads a process's
memory without stopping it. What stacks alone allow is said (`stack_verdicts`): which ranks sit
in which collective at which line, and which run elsewhere. What needs the agent
(`python -m distnb.run`): the collective's seq and shapes, which call a rank skipped, mismatches,
circles across groups, stopping and looking inside. Other hosts are searched by running this
search there, over ssh (`remote`). Python 3.14's `sys.remote_exec` could load the agent into a
running process later; distnb does not depend on it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from distnb.errors import ConfigError
from distnb.ranklist import format_ranks
from distnb.records.attach import AgentState, RankSnapshot, StackFrame

__all__ = ["NEEDS_AGENT", "find_ranks", "pyspy", "pyspy_stack", "stack_verdicts"]

NEEDS_AGENT = (
    "Without the agent: stacks only. The seq and shapes of each collective, which call a rank "
    "skipped, mismatches, circles across groups, stopping ranks and looking inside need the "
    "agent: run the job with `python -m distnb.run` instead of `torchrun`."
)
_PYSPY_TIMEOUT_S = 10.0
_COLLECTIVES = "torch/distributed/distributed_c10d.py"


def pyspy() -> str | None:
    """py-spy's executable, if installed (beside this Python, or on PATH)."""
    import sys

    here = Path(sys.executable).with_name("py-spy")
    return str(here) if here.exists() else shutil.which("py-spy")


def pyspy_stack(pid: int) -> tuple[StackFrame, ...]:
    """The main thread's stack of process `pid`, outermost first; () without py-spy or access."""
    exe = pyspy()
    if exe is None:
        return ()
    try:
        done = subprocess.run(
            [exe, "dump", "--json", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=_PYSPY_TIMEOUT_S,
            check=False,
        )
        threads = json.loads(done.stdout) if done.returncode == 0 else []
    except (subprocess.TimeoutExpired, ValueError, OSError):
        return ()
    main = next((t for t in threads if t.get("thread_name") == "MainThread"), None)
    if main is None and threads:
        main = threads[0]
    frames = main["frames"] if main else []
    return tuple(StackFrame(f["filename"], int(f["line"]), f["name"]) for f in reversed(frames))


def find_ranks(run: str | None = None) -> list[tuple[int, dict[str, str]]]:
    """(pid, environment) of every process on this machine that is a torchrun worker (of run
    `run`, its `TORCHELASTIC_RUN_ID`, where given), in rank order."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            raw = (entry / "environ").read_bytes()
        except OSError:
            continue
        env = dict(p.split("=", 1) for p in raw.decode(errors="replace").split("\0") if "=" in p)
        worker = "RANK" in env and "TORCHELASTIC_RUN_ID" in env and "LOCAL_RANK" in env
        if worker and (run is None or env["TORCHELASTIC_RUN_ID"] == run):
            found.append((int(entry.name), env))
    found.sort(key=lambda pe: int(pe[1]["RANK"]))
    return _workers_only(found)


def _workers_only(found: list[tuple[int, dict[str, str]]]) -> list[tuple[int, dict[str, str]]]:
    """A worker's children (DataLoader workers) inherit its RANK: keep the oldest process of
    each (run, rank), the worker itself."""
    kept: dict[tuple[str, str], tuple[int, dict[str, str]]] = {}
    for pid, env in sorted(found):
        kept.setdefault((env["TORCHELASTIC_RUN_ID"], env["RANK"]), (pid, env))
    return sorted(kept.values(), key=lambda pe: int(pe[1]["RANK"]))


def snapshots(run: str | None = None) -> list[RankSnapshot]:
    """Each rank found on this machine, with its py-spy stack. Several jobs: name one."""
    host = socket.gethostname()
    found = find_ranks(run)
    runs = sorted({env["TORCHELASTIC_RUN_ID"] for _, env in found})
    if len(runs) > 1:
        raise ConfigError(
            f"{len(runs)} torchrun jobs run on this machine ({', '.join(runs)}): name one "
            "(its TORCHELASTIC_RUN_ID)"
        )
    return [
        RankSnapshot(
            int(env["RANK"]),
            host,
            pid,
            AgentState.UNKNOWN,
            int(env.get("WORLD_SIZE", "0")),
            int(env.get("LOCAL_RANK", "-1")),
            stack=pyspy_stack(pid),
            source="py-spy",
        )
        for pid, env in found
    ]


def stack_verdicts(snaps: Sequence[RankSnapshot]) -> list[str]:
    """What stacks alone say: which ranks sit in which collective at which line, which run
    elsewhere (and where)."""
    inside: dict[tuple[str, str], list[int]] = defaultdict(list)
    outside: dict[str, list[int]] = defaultdict(list)
    for s in snaps:
        call = _collective(s.stack)
        if call is not None:
            inside[call].append(s.rank)
        elif s.stack:
            top = s.stack[-1]
            outside[f"{top.file}:{top.line} in {top.function}"].append(s.rank)
    out = [
        f"{format_ranks(ranks)} {'sits' if len(ranks) == 1 else 'sit'} in {op} at {where}"
        for (op, where), ranks in sorted(inside.items(), key=lambda kv: kv[1])
    ]
    if inside:
        out += [
            f"{format_ranks(ranks)} {'runs' if len(ranks) == 1 else 'run'} outside any "
            f"collective, at {where}"
            for where, ranks in sorted(outside.items(), key=lambda kv: kv[1])
        ]
    return out


def _collective(stack: Sequence[StackFrame]) -> tuple[str, str] | None:
    """(the torch.distributed function a stack is in, the caller's line), if any."""
    for i, f in enumerate(stack):
        if f.file.endswith(_COLLECTIVES) and f.function not in ("wrapper",) and i > 0:
            caller = next((c for c in reversed(stack[:i]) if "torch/" not in c.file), stack[i - 1])
            return f.function, f"{caller.file}:{caller.line}"
    return None
