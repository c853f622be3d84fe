"""The verdict on ranks that ended: from each rank's last snapshot (`RunFolder.finals`, written by
its agent as its process ended: `distnb.rank.agent.ending`), what each did last, in one line.

- a rank that raised in a collective is named with it, and the peers that had finished without
  calling it are named with where they stopped: ranks that ran different numbers of steps
  (uneven inputs) end so under gloo ("Connection closed by peer") and hang under NCCL;
- a rank that raised elsewhere is named with its error and line;
- a rank that left no snapshot ended without running its exit handlers: killed (SIGKILL, the
  out-of-memory killer) or crashed in native code.
"""

from __future__ import annotations

from collections.abc import Mapping

from distnb.ranklist import format_ranks
from distnb.records.attach import OpenCall, RankSnapshot

__all__ = ["UNEVEN", "endings"]

UNEVEN = (
    "the ranks ran different numbers of steps (uneven inputs: a DistributedSampler with "
    "drop_last=True, or DDP's join(), keeps them even)"
)


def endings(finals: Mapping[int, RankSnapshot], world: int) -> list[str]:
    """What the ranks of a world of `world` did last (see the module); [] if nothing is known."""
    if not finals:
        return []
    out = []
    for rank in sorted(finals):
        s = finals[rank]
        if s.current is None:
            if s.where.startswith("raised"):
                out.append(f"rank {rank} {s.where}")
            continue
        call = s.current
        error = s.where.rpartition(" at ")[0].removeprefix("raised ") or s.where
        words = (
            f"rank {rank} raised in {call.op} #{call.seq} on {call.group} at {call.site}: {error}"
        )
        gone = [p for p, f in sorted(finals.items()) if p != rank and _finished_before(f, call)]
        if gone:
            last = finals[gone[0]].last
            assert last is not None
            who = format_ranks(gone)
            words += (
                f"; {who} had finished {'its' if len(gone) == 1 else 'their'} script without "
                f"calling it (last: {last.op} #{last.seq} on {last.group} at {last.site}): "
                f"{UNEVEN}"
            )
        out.append(words)
    silent = [r for r in range(world) if r not in finals]
    if silent:
        out.append(
            f"{format_ranks(silent)} left no word as {'it' if len(silent) == 1 else 'they'} "
            "ended: killed (SIGKILL, out of memory?) or crashed in native code"
        )
    if not out:
        out.append("every rank finished its script")
    return out


def _finished_before(final: RankSnapshot, call: OpenCall) -> bool:
    """Whether a rank finished its script with its last collective on `call`'s group before it."""
    last = final.last
    finished = final.current is None and not final.where.startswith("raised")
    return finished and last is not None and last.group == call.group and last.seq < call.seq
