"""Ranks without the agent on other hosts: found and read there, over ssh.

`attach_processes(hosts=[...])` runs this module on each host at once, over ssh (as the user's
ssh reaches it: `ssh_args`, the remote `python`, by default this one's path, as on a cluster
whose hosts share the software): `python -m distnb.session.attach.remote [RUN]` finds the
torchrun workers of that host by their environment and reads their stacks with py-spy there
(`procs`), and prints them as JSON records, which this side decodes (`RankSnapshot`): nothing
is unpickled, and the host's answer is data. A host that cannot be reached, or has no py-spy,
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
    hosts: Sequence[str], run: str | None, ssh_args: Sequence[str] = (), python: str = ""
) -> list[RankSnapshot]:
    """Every host's torchrun workers with their py-spy stacks, in rank order."""
    line = [python or sys.executable, "-m", "distnb.session.attach.remote", *([run] if run else [])]
    command = shlex.join(line)
    with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
        answers = list(pool.map(lambda h: _ask(h, command, ssh_args), hosts))
    runs = sorted({r for answer in answers for r in answer["runs"]})
    if len(runs) > 1:
        raise ConfigError(
            f"{len(runs)} torchrun jobs run on {', '.join(hosts)} "
            f"({', '.join(runs)}): name one (its TORCHELASTIC_RUN_ID)"
        )
    snaps = [RankSnapshot.from_dict(d) for answer in answers for d in answer["ranks"]]
    return sorted(snaps, key=lambda s: s.rank)


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
    """On a host: its torchrun workers (of run `argv[0]`, if given) and their runs, as one
    JSON line."""
    args = list(sys.argv[1:] if argv is None else argv)
    if procs.pyspy() is None:
        sys.exit("py-spy is not installed on this host: pip install 'distnb[attach]'")
    run = args[0] if args else None
    runs = sorted({env["TORCHELASTIC_RUN_ID"] for _, env in procs.find_ranks(run)})
    try:
        ranks = [s.to_dict() for s in procs.snapshots(run)]
    except ConfigError as exc:
        sys.exit(str(exc))
    print(_MARK + json.dumps({"runs": runs, "ranks": ranks}), flush=True)


if __name__ == "__main__":
    main()
