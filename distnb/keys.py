"""The control plane's key layout, shared by the kernel and the ranks.

Every key lives under the session's prefix (a `PrefixStore(session_id, ...)`), so a restarted
cluster never reads a stale key of the one before. Kept free of torch so the kernel side can
import it cheaply.
"""

from __future__ import annotations

PG = "pg"  # prefix of the process group's own rendezvous keys
CHECK = "check"  # prefix of the checked-collective runtime's keys
CELL = "cell"  # the kernel's number of the cell being run


def stack_request(rank: int, n: int) -> str:
    return f"stackreq/{rank}/{n}"


def stack_reply(rank: int, n: int) -> str:
    return f"stack/{rank}/{n}"


def encode_cell(cell: int, run_id: int, check: bool) -> str:
    """The value of CELL: the cell's number as the notebook shows it, a run id unique within the
    session (one notebook cell may run several times through the Python API), and whether the
    checked runtime is on for it."""
    return f"{cell} {run_id} {int(check)}"


def decode_cell(value: bytes | str) -> tuple[int, int, bool]:
    text = value.decode() if isinstance(value, bytes) else value
    cell, run_id, check = text.split()
    return int(cell), int(run_id), check == "1"
