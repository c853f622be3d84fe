"""Attaching the notebook to a job distnb did not start (`distnb.attach`, `%dist_attach`).

- `attach(target)`: a job run through `python -m distnb.run` (its ranks run distnb's agent,
  `distnb.rank.agent`), found by its run folder, its run id, a Slurm job id, or `host:port`;
  returns an `AttachedJob` (`job`): status, live stacks, verdicts, timeline, stops, the text
  debugger, code in stopped frames, detach;
- `attach_processes()`: a torchrun job that did not opt in, read-only: its ranks found on this
  machine, or on the hosts named, over ssh (`remote`), by their environment, their stacks from
  py-spy (`procs`);
- `link`: the connection to a job's control plane; `prompts`: stopped ranks for the text
  debugger's desk; `verdict`: who waits for whom, where, and why (pure functions).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from distnb.contract.folders import RunFolder, base
from distnb.errors import ConfigError, SessionError
from distnb.session.attach import procs, remote
from distnb.session.attach.job import AttachedJob
from distnb.session.attach.link import Link
from distnb.views.attach import JobView

__all__ = ["AttachedJob", "attach", "attach_processes", "locate"]


def attach(target: str | None = None, *, timeout: float = 10.0) -> AttachedJob:
    """Attach to a running job of `python -m distnb.run`.

    `target`: its run folder (`~/.distnb/runs/<run id>`), its run id, a Slurm job id (the run
    of `python -m distnb.run` inside that job), or `host:port` of its control plane (a run
    folder on this machine must hold its secret); None: the newest run that has not ended.
    `timeout`: seconds to wait for the ranks' agents (a job that is still starting).

    >>> job = distnb.attach()          # the newest run
    >>> job.status()                   # per rank: state, collective, step; verdicts; stacks
    >>> job.stop(); job.debug()        # the debugger on every rank, here
    >>> job.detach()                   # the job goes on as it would have
    """
    folder = locate(target)
    endpoint = folder.endpoint()
    if folder.ended() is not None:
        raise SessionError(
            f"run {endpoint.run} has ended (exit status {folder.ended()}); nothing to attach to"
        )
    link = Link(endpoint, folder.secret(), connect_timeout_s=timeout)
    try:  # a wait cut short (an error, Ctrl-C) lets go of the job's control plane
        world = _registered(link, timeout)
    except BaseException:
        link.close()
        raise
    return AttachedJob(folder, link, world)


def _registered(link: Link, timeout: float) -> int:
    """The job's world size, once rank 0's agent has registered; every rank's agent, so that
    a first request reaches all of them (one still missing at the deadline is shown as such by
    the status: it has not imported torch, or it died)."""
    run = link.endpoint.run
    deadline = time.monotonic() + timeout
    while (first := link.registered(0)) is None:
        if time.monotonic() > deadline:
            raise SessionError(
                f"no agent of run {run} has started in {timeout:g} s: its script has "
                "not imported torch yet, or its workers do not run distnb's agent (see stderr "
                "of the job for a line starting with 'distnb:')"
            )
        time.sleep(0.05)
    world = first.world_size
    while time.monotonic() < deadline and any(link.registered(r) is None for r in range(world)):
        time.sleep(0.05)
    return world


def locate(target: str | None) -> RunFolder:
    """The run folder `target` names (see `attach`)."""
    root = base()
    if target is None:
        runs = sorted(
            (p for p in root.glob("*/endpoint.json") if not (p.parent / "ended").exists()),
            key=lambda p: p.stat().st_mtime,
        )
        if not runs:
            raise ConfigError(
                f"no running job under {root}: start one with `python -m distnb.run "
                "[torchrun's options] train.py`, or name its run folder"
            )
        return RunFolder(runs[-1].parent)
    path = Path(target).expanduser()
    if (path / "endpoint.json").exists():
        return RunFolder(path)
    if target.isdigit() and (root / f"slurm-{target}").exists():
        return RunFolder(root / f"slurm-{target}")
    if (root / target / "endpoint.json").exists():
        return RunFolder(root / target)
    host, _, port = target.rpartition(":")
    if host and port.isdigit():
        for candidate in root.glob("*/endpoint.json"):
            e = RunFolder(candidate.parent).endpoint()
            if e.port == int(port) and host in (e.host, e.hostname):
                return RunFolder(candidate.parent)
        raise ConfigError(
            f"no run folder under {root} is for {target}: attaching by address needs the run's "
            "secret, which is in its run folder; copy the folder here or name it"
        )
    hint = f" (a Slurm job id: no run slurm-{target} here)" if target.isdigit() else ""
    raise ConfigError(f"{target!r} is neither a run folder nor a run under {root}{hint}")


def attach_processes(
    target: str | None = None,
    *,
    hosts: Sequence[str] = (),
    ssh_args: Sequence[str] = (),
    python: str = "",
) -> JobView:
    """Read-only attach to a torchrun job without the agent (see `procs`): its ranks, their
    py-spy stacks (native frames included), each rank's state and the collective it waits in,
    and what stacks alone say. `target`: the job's launcher pid (or a rank's pid) or its run id
    (`TORCHELASTIC_RUN_ID`); none: the only job here, else the only one that looks hung (the
    view's note says which and why, and lists the others). `hosts`: where to look, over ssh
    (`remote`: `ssh_args` for ssh, `python` the hosts' Python, by default this one's path);
    none: this machine.

    >>> from distnb.session.attach import attach_processes
    >>> attach_processes()             # the job here, or the hung one of several
    >>> attach_processes("41873")      # the job whose torchrun has pid 41873
    >>> attach_processes(hosts=["node1", "node2"])
    """
    if not hosts and procs.pyspy() is None:
        raise ConfigError(
            "attaching without the agent reads stacks with py-spy: pip install 'distnb[attach]'"
        )
    if hosts:
        snaps, why = remote.snapshots_on(hosts, target, ssh_args, python)
    else:
        snaps, why = procs.look(target)
    where = ", ".join(hosts) if hosts else "this machine"
    if not snaps:
        raise ConfigError(
            f"no torchrun worker runs on {where} (none has RANK and "
            "TORCHELASTIC_RUN_ID in its environment)"
        )
    on = ", ".join(sorted({s.host for s in snaps}))
    title = (
        f"torchrun job on {on}, without distnb's agent: {len(snaps)} of "
        f"{snaps[0].world_size} ranks found"
    )
    note = f"{why}\n{procs.NEEDS_AGENT}" if why else procs.NEEDS_AGENT
    return JobView(title, tuple(snaps), tuple(procs.stack_verdicts(snaps)), note)
