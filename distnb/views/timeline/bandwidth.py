"""nccl-tests' bandwidth arithmetic: the bytes it reports per op and its bus-bandwidth factors
(see `distnb.views.timeline.model`'s docstring for the table)."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["ALIASES", "BUS_FACTORS", "GATHERED", "bus_factor", "nccl_bytes", "op_family"]

BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send": lambda n: 1.0,
}
ALIASES = {
    "all_reduce_coalesced": "all_reduce",
    "all_gather_into_tensor": "all_gather",
    "all_gather_single": "all_gather",
    "_all_gather_base": "all_gather",
    "all_gather_coalesced": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "all_to_all_single": "all_to_all",
    "isend": "send",
    "recv": "send",
    "irecv": "send",
    "batch_isend_irecv": "send",
}
GATHERED = {"all_gather", "gather"}  # nccl-tests counts the gathered output: n x the input


def op_family(op: str) -> str:
    return ALIASES.get(op, op)


def bus_factor(op: str, n: int) -> float | None:
    """nccl-tests' busbw factor for `op` on a group of `n` ranks; None for ops it does not rate."""
    f = BUS_FACTORS.get(op_family(op))
    return None if f is None or n < 1 else f(n)


def nccl_bytes(op: str, nbytes: int, n: int) -> int:
    """The bytes nccl-tests would report for `op`, from the per-rank input bytes `nbytes`."""
    return nbytes * n if op_family(op) in GATHERED else nbytes
