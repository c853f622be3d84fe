"""The tasks of a Slurm step on one node as distnb's engines, forked from one process:
`python -m distnb.rank.slurm_tasks FOLDER [ipengine arguments]`, run by srun as every task.

srun starts one task per rank, each where Slurm puts it with the user's options, with its own
environment (`SLURM_PROCID`: the task's number, which orders the ranks; `SLURM_LOCALID`; any
binding of GPUs) and CPUs. On each node the first of its tasks (the lowest of `SLURM_GTIDS`)
becomes the forker (`distnb.rank.forks`): it imports torch once and forks one engine per task of
the node. Every other task hands its place over to the forker (its environment and the CPUs it
may run on) and holds it until the forker has ended, so that the step keeps Slurm's count of
tasks and their resources; the engine forked for task t runs as task t would have, with task
t's environment and CPUs. Nothing is placed or numbered here that Slurm did not.

The handover is a unix socket in the node's abstract namespace, named by job and step; each side
checks that the other runs as the same user (`SO_PEERCRED`), so no one else can hand an engine
an environment or read one. A task holding a place ends when the forker's side of the socket
closes: when the forker ends, however it ends. The forked engines keep their logs and exit
statuses in `FOLDER/NODE/` (the folder is the profile's, which every node sees), and the forker
writes a failed engine's last lines to its own output, the job's or srun's.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import sys
import time
from collections.abc import Iterable

from distnb.rank import forks

__all__ = ["HANDOVER_S", "main"]

HANDOVER_S = 120.0  # for a node's tasks to start and hand their places over (a loaded node)
_RETRY_S = 0.05  # between a holding task's tries to reach a forker not listening yet


def main(argv: list[str]) -> int:
    folder, engine_args = argv[0], argv[1:]
    tasks = sorted(int(t) for t in os.environ["SLURM_GTIDS"].split(","))
    me = int(os.environ["SLURM_PROCID"])
    address = f"\0distnb-{os.getuid()}-{os.environ['SLURM_JOB_ID']}.{os.environ['SLURM_STEP_ID']}"
    if me != tasks[0]:
        return _hold(address, me)
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)  # before torch's import: the other tasks hand over meanwhile
    listener.listen(len(tasks))
    kept: list[socket.socket] = []  # open until this process ends: the holders wait for that
    own = _place(me, dict(os.environ), os.sched_getaffinity(0))
    return forks.fork(
        os.path.join(folder, node),
        engine_args,
        lambda: _gather(listener, own, tasks, kept),
        say_failures=True,
    )


def _place(task: int, environ: dict[str, str], cpus: Iterable[int]) -> forks.Place:
    node = environ.get("SLURMD_NODENAME", "")
    name = f"the engine of Slurm task {task} on {node}"
    return forks.Place(dict(environ), frozenset(map(int, cpus)) or None, name)


def _gather(
    listener: socket.socket, own: forks.Place, tasks: list[int], kept: list[socket.socket]
) -> list[forks.Place]:
    """The node's places in task order: this task's, and each other task's as it hands it over."""
    places = {tasks[0]: own}
    deadline = time.monotonic() + HANDOVER_S
    while len(places) < len(tasks):
        listener.settimeout(max(0.0, deadline - time.monotonic()))
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            missing = sorted(set(tasks) - set(places))
            raise RuntimeError(
                f"Slurm tasks {missing} on this node did not hand their places over within "
                f"{HANDOVER_S:.0f} s"
            ) from None
        if not _same_user(conn):
            conn.close()
            continue
        conn.settimeout(max(1.0, deadline - time.monotonic()))
        handed = json.loads(_read_line(conn))
        places[int(handed["task"])] = _place(int(handed["task"]), handed["environ"], handed["cpus"])
        kept.append(conn)
    listener.close()
    return [places[t] for t in tasks]


def _hold(address: str, task: int) -> int:
    """A task other than its node's first: hand its place to the forker, wait for its end."""
    deadline = time.monotonic() + HANDOVER_S
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(address)
            break
        except OSError:
            conn.close()
            if time.monotonic() > deadline:
                print(
                    f"distnb: Slurm task {task} found no forker of its node's engines within "
                    f"{HANDOVER_S:.0f} s (the node's first task did not start?)",
                    file=sys.stderr,
                )
                return 1
            time.sleep(_RETRY_S)
    if not _same_user(conn):
        print(f"distnb: Slurm task {task}: {address[1:]} is another user's", file=sys.stderr)
        return 1
    handed = {"task": task, "environ": dict(os.environ), "cpus": sorted(os.sched_getaffinity(0))}
    conn.sendall(json.dumps(handed).encode() + b"\n")
    with contextlib.suppress(OSError):  # a reset: the forker has ended too
        while conn.recv(4096):  # nothing is sent: this returns b"" once the forker has ended
            pass
    return 0


def _same_user(conn: socket.socket) -> bool:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return bool(uid == os.getuid())


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
