"""`python -m distnb.run [torchrun's options] train.py [its arguments]`: torchrun, attachable.

A thin entry point over torch's own elastic launcher (`torch.distributed.run`, what `torchrun`
is): it takes torchrun's arguments unchanged, and before handing them over (`host`) it

1. makes the job's run folder (`distnb.contract.folders`: `~/.distnb/runs/<run id>/`, readable by
   the user alone) with a fresh secret;
2. hosts the job's control plane: a `TCPStore` in this process (its server runs on a native
   thread, so it answers while the launcher waits for its workers), on loopback unless
   `--distnb-host ADDR` names an address, every value in it signed with the secret;
3. gives the workers a process-start hook (`distnb/rank/agent/boot`, put first on their
   `PYTHONPATH`; it chains to any `sitecustomize` it shadows) that loads distnb's agent once the
   script imports torch (`distnb.rank.agent`).

The launcher hosts the store rather than a rank because the ranks are what may die or hang:
the notebook must still reach the survivors. distnb's own options come first:
`--distnb-run NAME` names the run (default: the Slurm job's id, else the time and the pid),
`--distnb-host ADDR` the address the control plane listens on. Then `%dist_attach` (or
`distnb.attach(...)`) in a notebook on a machine that reaches the job.

On several nodes (`--nnodes 2`, the same command on each) one launcher hosts the control
plane, the one whose node owns its address (`--distnb-host`, else the rendezvous endpoint's
host), and the others join it through the run folder, which every node must see
(`distnb.runplace`): one run folder, one secret and one `host:port` for the whole job.

Plain `torchrun` opts in through the environment instead: `eval "$(python -m distnb.run
--distnb-env)"` exports `DISTNB_AGENT=1` and puts the hook first on `PYTHONPATH`; the hook then
runs in torchrun's own launcher too, and does there what this entry point does (`host`), once
torch is imported (`DISTNB_RUN` and `DISTNB_HOST` stand for the two options).
"""

from __future__ import annotations

import os
import shlex
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from distnb.contract.folders import Endpoint, RunFolder, run_id
from distnb.errors import ConfigError
from distnb.runplace import Place, join, place

__all__ = [
    "AGENT_VAR",
    "ATTACH_VAR",
    "BOOT",
    "Hosted",
    "env_lines",
    "host",
    "joined",
    "main",
    "split",
]

ATTACH_VAR = "DISTNB_ATTACH"  # the run folder, in every worker's environment
AGENT_VAR = "DISTNB_AGENT"  # 1: plain torchrun's launcher hosts a control plane (the hook)
RUN_VAR, HOST_VAR = "DISTNB_RUN", "DISTNB_HOST"  # --distnb-run and --distnb-host, for the hook
BOOT = Path(__file__).resolve().parent / "rank" / "agent" / "boot"
_OWN = {"--distnb-host": "", "--distnb-run": ""}
_ENV = "--distnb-env"


class Hosted:
    """A job's control plane, hosted in its launcher: the run folder and the store's server
    (the server stops with its last reference: keep this object). `server` None: a node that
    joins another node's control plane (`joined`)."""

    def __init__(self, folder: RunFolder, server: Any) -> None:
        self.folder, self.server = folder, server

    def end(self, status: int) -> None:
        """Say in the run folder that the launcher has returned; stop serving. A joining
        node's launcher says nothing: the job ends with the hosting node's."""
        if self.server is not None:
            self.folder.mark_ended(status)
        self.server = None


def split(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """distnb's own options (they come first) and torchrun's arguments after them."""
    own = dict(_OWN)
    i = 0
    while i < len(argv) and argv[i].startswith("--distnb-"):
        name, eq, value = argv[i].partition("=")
        if name not in own:
            known = ", ".join([*own, _ENV])
            raise ConfigError(f"unknown option {name} (distnb.run's own options: {known})")
        if not eq:
            i += 1
            if i == len(argv):
                raise ConfigError(f"{name} needs a value, e.g. {name}=...")
            value = argv[i]
        own[name] = value
        i += 1
    return own, argv[i:]


def host(name: str = "", address: str = "127.0.0.1", argv: tuple[str, ...] = ()) -> Hosted:
    """Make the run folder, host the control plane here, and set the environment the workers
    inherit (the run folder; the hook first on `PYTHONPATH`)."""
    import torch.distributed as dist

    folder = RunFolder.create(run_id(name))
    folder.write_secret()
    server = dist.TCPStore(
        address, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )
    endpoint = Endpoint(
        folder.path.name, address, server.port, socket.gethostname(), os.getpid(), time.time(), argv
    )
    folder.write_endpoint(endpoint)
    _hand_over(folder)
    print(f"distnb: attach to this job with %dist_attach {folder.path}", file=sys.stderr)
    return Hosted(folder, server)


def joined(where: Place) -> Hosted:
    """On a node that does not host its job's control plane (`distnb.runplace`): the workers
    inherit the hosting node's run folder, and their agents connect to its store."""
    folder = join(where)
    _hand_over(folder)
    print(
        f"distnb: this node's ranks join the control plane at {where.address} "
        f"(run folder {folder.path})",
        file=sys.stderr,
    )
    return Hosted(folder, None)


def _hand_over(folder: RunFolder) -> None:
    """The environment the workers inherit: the run folder; the hook first on `PYTHONPATH`."""
    os.environ[ATTACH_VAR] = str(folder.path)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(BOOT) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(BOOT), *paths])


def env_lines() -> str:
    """The shell lines that make plain `torchrun` attachable (`--distnb-env`)."""
    boot = shlex.quote(str(BOOT))
    return (
        f"export {AGENT_VAR}=1\n"
        f'export PYTHONPATH={boot}"${{PYTHONPATH:+{os.pathsep}$PYTHONPATH}}"\n'
    )


USAGE = """usage: python -m distnb.run [distnb's options] [torchrun's options] SCRIPT [ARGS]

torchrun, attachable: the same arguments as torchrun, and a notebook can attach to the job
(%dist_attach, distnb.attach()). distnb's options come first:
  --distnb-run NAME   the run's name (default: the Slurm job's id, else the time and the pid)
  --distnb-host ADDR  the address the job's control plane listens on (default: loopback)
  --distnb-env        print the shell lines that make plain `torchrun` attachable:
                      eval "$(python -m distnb.run --distnb-env)"
Run folders: $DISTNB_RUNS, else ~/.distnb/runs.

torchrun's own options follow.
"""


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == [_ENV]:
        print(env_lines(), end="")
        return
    if _asks_help(args):
        print(USAGE)
        from torch.distributed.run import get_args_parser

        get_args_parser().print_help()
        return
    try:
        own, args = split(args)
    except ConfigError as exc:
        sys.exit(f"distnb.run: {exc}")
    from torch.distributed.run import main as torchrun

    try:
        where = place(own["--distnb-run"], own["--distnb-host"], args)
        hosted = host(where.run, where.address, tuple(args)) if where.hosts else joined(where)
    except ConfigError as exc:
        sys.exit(f"distnb.run: {exc}")
    status = 1
    try:
        torchrun(args)
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
        raise
    finally:
        hosted.end(status)


def _asks_help(args: list[str]) -> bool:
    """`-h` or `--help` among the launcher's options (before the script, whose own they are
    after it)."""
    for arg in args:
        if arg in ("-h", "--help"):
            return True
        if not arg.startswith("-") and arg.endswith(".py"):
            return False
    return not args


if __name__ == "__main__":
    main()
