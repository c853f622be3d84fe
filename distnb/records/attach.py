"""Records of a job distnb did not start, as the notebook reads them when it attaches.

A rank of an attached job (a `torchrun` job run through `python -m distnb.run`) answers the
notebook with a `RankSnapshot`: where it is (its state, the collective it is in, the last one it
finished, its step) and its live Python stack. Without the agent, `py-spy` gives the stack only
(`source="py-spy"`). The verdicts are pure functions over these records
(`distnb.judgement.snapshot`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from distnb.records.codec import Ranks, Record
from distnb.records.collective import CallSite, CollectiveEvent, Fingerprint

__all__ = ["AgentState", "OpenCall", "RankSnapshot", "StackFrame"]


class AgentState(str, Enum):
    RUNNING = "running"  # in none of its collectives
    COLLECTIVE = "in collective"  # between entering a collective and its completion
    STOPPED = "stopped"  # in the debugger, at a prompt the notebook answers
    HELD = "held"  # waiting before a collective while a peer is stopped
    GONE = "gone"  # its process has ended, or it does not answer
    UNKNOWN = "unknown"  # seen without the agent: no state but its stack


@dataclass(frozen=True, slots=True)
class StackFrame(Record):
    """One frame of a stack: `file:line` in `function`, and the line's text."""

    file: str
    line: int
    function: str
    code: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


@dataclass(frozen=True, slots=True)
class OpenCall(Record):
    """The collective a rank entered and has not finished: (group, seq), what it is, where.

    `group` is the group as users know it (`WORLD`), `group_name` its registered name, `members`
    its global ranks; `age_s` how long ago the rank entered it."""

    group: str
    group_name: str
    seq: int
    op: str
    members: Ranks
    site: CallSite
    age_s: float = 0.0
    fingerprint: Fingerprint | None = None

    def __str__(self) -> str:
        return f"{self.op} #{self.seq} on {self.group} at {self.site}"


@dataclass(frozen=True, slots=True)
class RankSnapshot(Record):
    """One rank as the notebook saw it. `calls` holds, per group (registered name), how many
    collectives the rank has entered there; `last` the last collective it finished; `step` the
    optimizer steps it has taken (None: unknown); `where` the line it is stopped at."""

    rank: int
    host: str
    pid: int
    state: AgentState
    world_size: int = 0
    local_rank: int = -1
    step: int | None = None
    current: OpenCall | None = None
    last: CollectiveEvent | None = None
    calls: tuple[tuple[str, int], ...] = ()
    stack: tuple[StackFrame, ...] = ()
    where: str = ""
    source: str = "agent"

    def count(self, group_name: str) -> int:
        """How many collectives this rank has entered on the group (0 if none)."""
        return dict(self.calls).get(group_name, 0)
