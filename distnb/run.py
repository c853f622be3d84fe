"""`python -m distnb.run [torchrun's options] train.py [its arguments]`: torchrun, attachable.

A thin entry point over torch's own elastic launcher (`torch.distributed.run`, what `torchrun`
is): it takes torchrun's arguments unchanged, and before handing them over it

1. makes the job's run folder (`distnb.jobfolder`: `~/.distnb/runs/<run id>/`, readable by the
   user alone) with a fresh secret;
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
"""

from __future__ import annotations

import os
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

from distnb.errors import ConfigError
from distnb.jobfolder import Endpoint, JobFolder, run_id

__all__ = ["ATTACH_VAR", "BOOT", "main", "split"]

ATTACH_VAR = "DISTNB_ATTACH"  # the run folder, in every worker's environment
BOOT = Path(__file__).resolve().parent / "rank" / "agent" / "boot"
_OWN = {"--distnb-host": "127.0.0.1", "--distnb-run": ""}


def split(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """distnb's own options (they come first) and torchrun's arguments after them."""
    own = dict(_OWN)
    i = 0
    while i < len(argv) and argv[i].startswith("--distnb-"):
        name, eq, value = argv[i].partition("=")
        if name not in own:
            known = ", ".join(own)
            raise ConfigError(f"unknown option {name} (distnb.run's own options: {known})")
        if not eq:
            i += 1
            if i == len(argv):
                raise ConfigError(f"{name} needs a value, e.g. {name}=...")
            value = argv[i]
        own[name] = value
        i += 1
    return own, argv[i:]


def main(argv: list[str] | None = None) -> None:
    try:
        own, args = split(list(sys.argv[1:] if argv is None else argv))
    except ConfigError as exc:
        sys.exit(f"distnb.run: {exc}")
    import torch.distributed as dist
    from torch.distributed.run import main as torchrun

    folder = JobFolder.create(run_id(own["--distnb-run"]))
    secret = folder.write_secret()
    host = own["--distnb-host"]
    server = dist.TCPStore(
        host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )
    run = folder.path.name
    endpoint = Endpoint(
        run, host, server.port, socket.gethostname(), os.getpid(), time.time(), tuple(args)
    )
    folder.write_endpoint(endpoint)
    os.environ[ATTACH_VAR] = str(folder.path)
    paths = [str(BOOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    print(f"distnb: attach to this job with %dist_attach {folder.path}", file=sys.stderr)
    status = 1
    try:
        torchrun(args)
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
        raise
    finally:
        folder.mark_ended(status)
        del server  # the store's server stops with its last reference
    del secret


if __name__ == "__main__":
    main()
