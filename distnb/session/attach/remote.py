"""Ranks without the agent on other hosts: found and read there, over ssh.

`attach_processes(hosts=[...])` runs this module on each host at once, over ssh (as the user's
ssh reaches it: `ssh_args`, the remote `python`, by default this one's path, as on a cluster
whose hosts share the software): `python -m distnb.session.attach.remote [TARGET]` finds the
torchrun job of that host (`procs.look`: the one TARGET names, else the only one, else the only
one that looks hung), reads its ranks' stacks with py-spy there, and prints them as JSON
records, which this side decodes (`RankSnapshot`): nothing is unpickled, and the host's answer
is data. A host that cannot be reached, or has no py-spy,
is named with what ssh or the host said.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from distnb.errors import ConfigError
from distnb.records.attach import RankSnapshot
from distnb.session.attach import procs

__all__ = ["SSH_TIMEOUT_S", "main", "snapshots_on"]

SSH_TIMEOUT_S = 60.0  # a host's answer: ssh, Python's start, a py-spy dump per rank
_MARK = "distnb-ranks:"  # the line that holds the answer (a login banner may come before it)


def snapshots_on(
    hosts: Sequence[str], target: str | None, ssh_args: Sequence[str] = (), python: str = ""
) -> tuple[list[RankSnapshot], str]:
    """Every host's torchrun workers with their py-spy stacks, in rank order, and why each
    host's job was the one chosen ("" where there was no choice)."""
    argv = [python or sys.executable, "-m", "distnb.session.attach.remote"]
    line = [*argv, *([target] if target else [])]
    command = shlex.join(line)
    with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
        answers = list(pool.map(lambda h: _ask(h, command, ssh_args), hosts))
    runs = sorted({r for answer in answers for r in answer["runs"]})
    if len(runs) > 1:
        raise ConfigError(
            f"{len(runs)} torchrun jobs run on {', '.join(hosts)} "
            f"({', '.join(runs)}), one chosen per host: name one (its TORCHELASTIC_RUN_ID)"
        )
    snaps = [RankSnapshot.from_dict(d) for answer in answers for d in answer["ranks"]]
    why = "\n".join(f"{h}: {a['why']}" for h, a in zip(hosts, answers) if a.get("why"))
    return sorted(snaps, key=lambda s: s.rank), why


def _ask(host: str, command: str, ssh_args: Sequence[str]) -> dict[str, Any]:
    try:
        done = subprocess.run(
            ["ssh", *ssh_args, host, command],
            capture_output=True,
            text=True,
            timeout=SSH_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"{host} did not answer in {SSH_TIMEOUT_S:g} s over ssh: is it "
            "reachable (ssh_args=...)?"
        ) from None
    found = [line for line in done.stdout.splitlines() if line.startswith(_MARK)]
    if done.returncode != 0 or not found:
        said = (done.stderr.strip() or done.stdout.strip())[-500:]
        raise ConfigError(
            f"could not read the ranks on {host} over ssh (exit {done.returncode}): {said}; it "
            "needs distnb and py-spy there (python=... names its Python)"
        )
    answer: dict[str, Any] = json.loads(found[-1][len(_MARK) :])
    return answer


def main(argv: Sequence[str] | None = None) -> None:
    """On a host: its torchrun job's ranks (the job `argv[0]` names, if given: see
    `procs.look`), its run, and why that job, as one JSON line."""
    args = list(sys.argv[1:] if argv is None else argv)
    if procs.pyspy() is None:
        sys.exit("py-spy is not installed on this host: pip install 'distnb[attach]'")
    try:
        snaps, why = procs.look(args[0] if args else None)
    except ConfigError as exc:
        if "no torchrun worker" not in str(exc):
            sys.exit(str(exc))
        snaps, why = [], ""  # none here: other hosts may have them
    runs = sorted({_run_of(s.pid) for s in snaps} - {""})
    ranks = [s.to_dict() for s in snaps]
    print(_MARK + json.dumps({"runs": runs, "ranks": ranks, "why": why}), flush=True)


def _run_of(pid: int) -> str:
    return next((env["TORCHELASTIC_RUN_ID"] for p, env in procs.find_ranks() if p == pid), "")


if __name__ == "__main__":
    main()
