"""Where a job's control plane lives when `python -m distnb.run` starts it on several nodes.

torchrun runs one launcher per node, each with the same command line. One of them hosts the
job's control plane; the others **join** it: their workers' agents connect to that one store,
so one run folder, one secret and one `host:port` reach every rank of the job, and the notebook
attaches once. Which launcher hosts it: the one on the node that owns the control plane's
address, `--distnb-host ADDR` where given, else the host of torchrun's rendezvous endpoint
(`--rdzv-endpoint`, or `--master-addr` for the static rendezvous), which every node names
already. A node owns an address when it can bind a socket to it.

The joiners read the run folder the hosting node wrote, `DISTNB_RUNS/<run id>`, so every
node must see it: a shared home (as clusters have), `DISTNB_RUNS` on a shared file system, or
a copy made beforehand (`scp -rp`). The secret never travels over the network in clear. The
run id must be the same on every node: `--distnb-run NAME`, else the Slurm job's
(`slurm-<job id>`), else torchrun's `--rdzv-id`.

Why not one control plane per node: the notebook would need every node's folder and secret,
and would merge the answers of several stores; a rank on another node costs nothing more
through one store, since the notebook pulls (nothing is written per collective).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass

from distnb.contract.folders import RunFolder, base, run_id
from distnb.errors import ConfigError

__all__ = ["JOIN_S", "Place", "join", "owns", "place"]

JOIN_S = 300.0  # how long a joining node waits for the hosting node's run folder
_POLL_S = 0.2


@dataclass(frozen=True, slots=True)
class Place:
    """Where this launcher's job has its control plane, and whether this launcher hosts it."""

    run: str
    address: str
    hosts: bool


def place(name: str, address: str, torchrun_args: list[str]) -> Place:
    """This launcher's place in its job (see the module); `name` and `address`: distnb's own
    options as given ("" where not)."""
    from torch.distributed.run import get_args_parser, parse_min_max_nnodes

    args = get_args_parser().parse_args(torchrun_args)
    _, max_nodes = parse_min_max_nnodes(args.nnodes)
    if args.standalone or max_nodes == 1:
        return Place(run_id(name), address or "127.0.0.1", True)
    run = name or _common_run(args.rdzv_id)
    if not address:
        endpoint = args.rdzv_endpoint or f"{args.master_addr}:{args.master_port}"
        address = endpoint.rpartition(":")[0] or endpoint
    try:
        address = socket.gethostbyname(address)
    except OSError as exc:
        raise ConfigError(
            f"cannot resolve {address!r}, the control plane's address: "
            f"name it with --distnb-host ADDR ({exc})"
        ) from None
    if address.startswith("127."):
        raise ConfigError(
            f"a job on {args.nnodes} nodes needs its control plane on an address every node "
            f"reaches, not {address}: give --distnb-host ADDR (the first node's address) or "
            "torchrun's --rdzv-endpoint HOST:PORT"
        )
    return Place(run, address, owns(address))


def _common_run(rdzv_id: str) -> str:
    job = os.environ.get("SLURM_JOB_ID")
    if job:
        return f"slurm-{job}"
    if rdzv_id and rdzv_id != "none":
        return rdzv_id
    raise ConfigError(
        "a job on several nodes needs one run name on every node: give --distnb-run NAME "
        "(the same on each node) or torchrun's --rdzv-id ID"
    )


def owns(address: str) -> bool:
    """Whether this machine has `address` (a socket binds to it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((address, 0))
        except OSError:
            return False
    return True


def join(where: Place, wait_s: float = JOIN_S) -> RunFolder:
    """The run folder of the node that hosts `where`'s control plane, once it has written it."""
    folder = RunFolder(base() / where.run)
    deadline, said = time.monotonic() + wait_s, False
    while not (folder.path / "endpoint.json").exists():
        if time.monotonic() > deadline:
            raise ConfigError(
                f"no endpoint.json in {folder.path} after {wait_s:g} s: the node with address "
                f"{where.address} hosts this job's control plane and writes its run folder "
                "there; every node must see that folder: a shared home, DISTNB_RUNS on a shared "
                "file system, or a copy of it made before this node starts (scp -rp)"
            )
        if not said:
            print(
                f"distnb: waiting for the run folder {folder.path}, written by the node "
                f"with address {where.address}",
                file=sys.stderr,
            )
            said = True
        time.sleep(_POLL_S)
    endpoint, ended = folder.endpoint(), folder.ended()
    if ended is not None or endpoint.host != where.address:
        raise ConfigError(
            f"the run folder {folder.path} is of another run (control plane at {endpoint.host}, "
            f"{'ended' if ended is not None else 'not ' + where.address}): remove it, or name "
            "this run otherwise on every node (--distnb-run NAME)"
        )
    folder.secret()  # readable here, or say now who can attach
    return folder
