"""The wire between the notebook and an attached job's rank agents: typed requests and answers.

Both sides import what they write and read from here; nothing is an ad-hoc dict, and no marker
is written on both sides. Three channels, each a tagged union of records (the codec's `kind`):

- to a rank's serving thread (`keys.agent_request`, answered under `keys.agent_reply`):
  `AgentRequest` = `Status` | `Events` | `Stop` | `Hold` | `Release` | `Break` | `Detach` |
  `Profile` | `ProfileReport`,
  written by `dumps_request` and read by `loads_request`;
- to a stopped rank's debugger prompt (`keys.answer`), besides the pdb commands the user types:
  `PromptAnswer` = `Execute` (code in the stopped frame) | `Call` (a `FrameQuery` over the frame's
  names, answered under `keys.agent_result`) | `Panel` | `Detach`, written as one line
  (`answer_line`: `PROMPT_MARK` and the record's JSON) and told from a pdb command by
  `read_answer`;
- back to the notebook: a `Reply` for each request and each `Call` (a value, or the error the
  rank raised); `Taped` (what `Events` answers: `Recorded`s, collectives with their
  fingerprints),
  `Listening` (where `Listen` started debugpy) and `AgentInfo` (what an agent says at its start,
  under `keys.agent_rank`).

Example::

    line = dumps_request(Stop(StopAt.STEP))  # '{"kind": "stop", "at": "step"}'
    loads_request(line) == Stop(StopAt.STEP)
    read_answer(answer_line(Execute("x.shape"))) == Execute("x.shape")
    read_answer("p x") is None  # a pdb command
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar, cast, get_args

from distnb.records.codec import Record, decode, encode
from distnb.records.collective import CollectiveEvent, Fingerprint
from distnb.records.overflow import WatchOptions

__all__ = [
    "PROMPT_MARK",
    "AgentInfo",
    "AgentRequest",
    "Break",
    "Call",
    "Detach",
    "Digests",
    "Events",
    "Execute",
    "FrameQuery",
    "Hold",
    "Listen",
    "Listening",
    "Panel",
    "PromptAnswer",
    "Recorded",
    "RelayTo",
    "Release",
    "Reply",
    "Shapes",
    "Status",
    "Stop",
    "StopAt",
    "Taped",
    "Watch",
    "WatchReport",
    "answer_line",
    "dumps_reply",
    "dumps_request",
    "loads_reply",
    "loads_request",
    "read_answer",
]

# A notebook's own answer at a stopped rank's prompt starts with it: a user cannot type it, so
# no pdb command the user types is taken for one.
PROMPT_MARK = "\0"


class StopAt(str, Enum):
    COLLECTIVE = "collective"  # before the rank's next collective goes to the backend
    STEP = "step"  # after its next optimizer step
    NOW = "now"  # at once, where its main thread is (a signal: `distnb.rank.agent.safepoints`)


# --- requests to a rank's serving thread -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Status(Record):
    """The rank's `RankSnapshot`, with the live stack of its main thread."""

    kind: ClassVar[str] = "status"


@dataclass(frozen=True, slots=True)
class Events(Record):
    """The rank's collectives recorded from the `after`-th on (its tape counts them), the last
    `last` of them at most: a `Taped`. The notebook asks from where its copy has gaps or calls
    not ended, so a verdict moves only what changed."""

    kind: ClassVar[str] = "events"
    last: int = 1000
    after: int = 0


@dataclass(frozen=True, slots=True)
class Stop(Record):
    """Stop in the debugger at the next safe point of `at`'s kind, or at once (`StopAt.NOW`)."""

    kind: ClassVar[str] = "stop"
    at: StopAt = StopAt.COLLECTIVE


@dataclass(frozen=True, slots=True)
class Hold(Record):
    """Wait before the next collective until `Release` (a peer is stopped)."""

    kind: ClassVar[str] = "hold"


@dataclass(frozen=True, slots=True)
class Release(Record):
    """End a `Hold`."""

    kind: ClassVar[str] = "release"


@dataclass(frozen=True, slots=True)
class Break(Record):
    """A breakpoint at `file` (a path, or the end of a loaded module's) and `line`, with an
    optional condition; the reply is the file found. `check`: only check it (JupyterLab's panel
    sets it, in the rank's debugpy)."""

    kind: ClassVar[str] = "break"
    file: str
    line: int
    cond: str | None = None
    check: bool = False


@dataclass(frozen=True, slots=True)
class Detach(Record):
    """Forget every request, release a hold, clear breakpoints and watches; at a stopped rank's
    prompt, run on as if it had never stopped."""

    kind: ClassVar[str] = "detach"


@dataclass(frozen=True, slots=True)
class Profile(Record):
    """Profile the rank's next `steps` optimizer steps with `torch.profiler` (None: until a
    `ProfileReport` ends it), from the end of the step it is in (`distnb.rank.profiling`)."""

    kind: ClassVar[str] = "profile"
    steps: int | None = None


@dataclass(frozen=True, slots=True)
class ProfileReport(Record):
    """How the rank's profile stands: a `Profiled`, with the profile once it has stopped;
    `end`: end a profile asked without a step count at the rank's next step."""

    kind: ClassVar[str] = "profile_report"
    end: bool = False


AgentRequest = Status | Events | Stop | Hold | Release | Break | Detach | Profile | ProfileReport


# --- a stopped rank's frame: what `Call` asks of it --------------------------------------------


@dataclass(frozen=True, slots=True)
class Shapes(Record):
    """The frame's shape table (a `ShapeScan`); `names` empty: every name."""

    kind: ClassVar[str] = "shapes"
    names: tuple[str, ...] = ()
    include_all: bool = False


@dataclass(frozen=True, slots=True)
class Digests(Record):
    """Replica digests (a list of `Digest`) of the modules, tensors and optimizers `names`."""

    kind: ClassVar[str] = "digests"
    names: tuple[str, ...]
    grads: bool = False
    buffers: bool = False


@dataclass(frozen=True, slots=True)
class Watch(Record):
    """Trace overflow on the module the frame calls `name` from now on."""

    kind: ClassVar[str] = "overflow"
    name: str
    options: WatchOptions


@dataclass(frozen=True, slots=True)
class WatchReport(Record):
    """Each traced module's `RankOverflowReport`, by name."""

    kind: ClassVar[str] = "overflow_report"


@dataclass(frozen=True, slots=True)
class Listen(Record):
    """Start the rank's debugpy for JupyterLab's panel; the answer is a `Listening`."""

    kind: ClassVar[str] = "listen"


@dataclass(frozen=True, slots=True)
class RelayTo(Record):
    """Carry the rank's debugpy over the job's control plane on `channel` (a notebook on
    another host)."""

    kind: ClassVar[str] = "relay"
    channel: str


@dataclass(frozen=True, slots=True)
class Pull(Record):
    """The value at `path` (a name or dotted path) as the frame sees it, tensors on the CPU,
    pickled if at most `limit` bytes: the answer is `[what, base64 of the pickle]`, or a
    `Refusal`'s dict (`%dist_pull` on an attached job)."""

    kind: ClassVar[str] = "pull"
    path: str
    limit: int


@dataclass(frozen=True, slots=True)
class Push(Record):
    """Bind each of `names` to its value, pickled and base64-encoded in `values`, in the frame
    (its locals: a function's frame keeps them as pdb's assignments are kept)."""

    kind: ClassVar[str] = "push"
    names: tuple[str, ...]
    values: tuple[str, ...]


FrameQuery = Shapes | Digests | Watch | WatchReport | Listen | RelayTo | Pull | Push


# --- answers at a stopped rank's prompt --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Execute(Record):
    """Execute `code` in the stopped frame, as a cell (its last expression shown)."""

    kind: ClassVar[str] = "execute"
    code: str


@dataclass(frozen=True, slots=True)
class Call(Record):
    """Answer `query` over the stopped frame's names; the `Reply` goes under
    `keys.agent_result(rank, reply)` (`reply`: the number of the prompt answered)."""

    kind: ClassVar[str] = "call"
    query: FrameQuery
    reply: int


@dataclass(frozen=True, slots=True)
class Panel(Record):
    """Hand the rank to JupyterLab's panel: it suspends in debugpy where it is stopped."""

    kind: ClassVar[str] = "panel"


PromptAnswer = Execute | Call | Panel | Detach


# --- answers to the notebook -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reply(Record):
    """A rank's answer: `value` (JSON: a record's dict, or plain values), or `error`
    (`"TypeName: message"`) when it raised."""

    value: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class Recorded(Record):
    """One collective a rank recorded, with its fingerprint (what `Events` answers)."""

    event: CollectiveEvent
    fingerprint: Fingerprint


@dataclass(frozen=True, slots=True)
class Taped(Record):
    """What `Events` answers: the rank's collectives recorded so far (`count`), and those asked
    for, the first of them the `first`-th."""

    count: int
    first: int
    records: tuple[Recorded, ...] = ()


@dataclass(frozen=True, slots=True)
class Listening(Record):
    """Where a rank's debugpy listens (its loopback), and the folders whose frames are not the
    user's."""

    host: str
    port: int
    folders: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AgentInfo(Record):
    """What a rank's agent says at its start: where it runs, and its place in the job."""

    host: str
    pid: int
    local_rank: int
    world_size: int
    started: float = 0.0


# --- the wire ------------------------------------------------------------------------------------


def _reader(union: Any, what: str) -> Callable[[Mapping[str, Any]], Any]:
    """Decode one of `union`'s records by its `kind`; an unknown kind is a ValueError."""
    by_kind: dict[str, type[Any]] = {cls.kind: cls for cls in get_args(union)}

    def read(data: Mapping[str, Any]) -> Any:
        found = data.get("kind")
        cls = by_kind.get(found) if isinstance(found, str) else None
        if cls is None:
            known = ", ".join(sorted(by_kind))
            raise ValueError(f"unknown {what} {found!r}: expected one of {known}")
        return decode(cls, data)

    return read


_read_request = _reader(AgentRequest, "agent request")
_read_answer = _reader(PromptAnswer, "prompt answer")


def dumps_request(request: AgentRequest) -> str:
    """`request` as the JSON text posted to a rank's serving thread."""
    return json.dumps(encode(request))


def loads_request(raw: str | bytes) -> AgentRequest:
    """The request `dumps_request` wrote; ValueError for one of no known kind, or not JSON."""
    return cast(AgentRequest, _read_request(_json_object(raw, "an agent request")))


def answer_line(answer: PromptAnswer) -> str:
    """`answer` as the line that answers a stopped rank's prompt."""
    return PROMPT_MARK + json.dumps(encode(answer))


def read_answer(line: str) -> PromptAnswer | None:
    """The notebook's answer `answer_line` wrote, or None for a line the user typed (a pdb
    command); ValueError for a marked line of no known kind."""
    if not line.startswith(PROMPT_MARK):
        return None
    return cast(PromptAnswer, _read_answer(_json_object(line[len(PROMPT_MARK) :], "an answer")))


def dumps_reply(reply: Reply) -> str:
    return json.dumps(encode(reply))


def loads_reply(raw: str | bytes) -> Reply:
    return decode(Reply, _json_object(raw, "a reply"))


def _json_object(raw: str | bytes, what: str) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except ValueError:
        raise ValueError(f"{what} is not JSON: {raw[:80]!r}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what} is a JSON object, not {type(data).__name__}: {raw[:80]!r}")
    return data
