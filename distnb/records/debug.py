"""What a stopped rank asks the kernel for: a line typed by the user.

A rank's debugger prompt and `input()` both come here: the rank posts an `InputRequest` to the
control plane (`distnb.contract.keys.ask`), the kernel asks the user through its own stdin and posts
the answer (`distnb.contract.keys.answer`). Answers are text; two words are the kernel's own, never
typed text: `QUIT` (the user interrupted the prompt: leave the debugger as `q` does) and `SKIP` (no
frontend can answer: carry on as if the breakpoint were not there).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum

from distnb.records.codec import Record

__all__ = ["QUIT", "SKIP", "AskKind", "DebugStop", "InputRequest"]

# Prefixed with NUL so that no line a user types can be mistaken for them.
QUIT = "\0quit"
SKIP = "\0skip"


class AskKind(str, Enum):
    DEBUGGER = "debugger"  # a debugger's prompt: the rank is stopped
    INPUT = "input"  # `input()` in the rank's code
    PASSWORD = "password"  # `getpass.getpass()`: the frontend hides what is typed


@dataclass(frozen=True, slots=True)
class InputRequest(Record):
    """One prompt of one rank. `n` numbers it session-wide (its answer's key); `where` is the
    rank's current line as users know it (`cell In[5] line 3`, `train.py:12`); `stdout` and
    `stderr` count the characters the rank had written in this run when it asked, so the kernel
    shows all of them before the prompt; `mesh` is the rank's place in the DeviceMesh its code
    uses (`{"dp": 1, "tp": 0}`; empty without one), for commands to a slice of the ranks."""

    n: int
    rank: int
    run_id: int
    prompt: str
    where: str = ""
    kind: AskKind = AskKind.DEBUGGER
    stdout: int = 0
    stderr: int = 0
    mesh: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, raw: str | bytes) -> InputRequest:
        return cls.from_dict(json.loads(raw))


@dataclass(frozen=True, slots=True)
class DebugStop(Record):
    """A stretch of time `rank` sat stopped in a debugger (at a prompt, or in JupyterLab's
    debugger), on the rank's clock (`time.monotonic_ns()`, as its collective events), in run
    `run_id`. Peers that waited for it meanwhile were waiting for the user, not for a
    straggler."""

    rank: int
    start_ns: int
    end_ns: int
    run_id: int = 0
