"""The agent's serving thread: answers the notebook's requests, one at a time.

The notebook numbers each request to a rank (`keys.agent_calls`, a counter), posts it under its
number (`keys.agent_request`) and reads the reply (`keys.agent_reply`). The thread blocks in the
store's `wait` between requests (the GIL released): an idle agent costs nothing, and nothing is
written to the store per collective. It has a store connection of its own, so it answers while
the main thread is blocked in a collective or stopped in the debugger.

Requests are the records of `distnb.records.agent` (`AgentRequest`), answered with a `Reply`:

- `Status`: a `RankSnapshot` with the live stack of the main thread;
- `Events` (`last`, `after`): the collectives recorded from the `after`-th on, a `Taped`;
- `Stop` (`at`: a collective or a step), `Hold`, `Release`, `Break` (`file`, `line`, `cond`),
  `Detach`: noted for the main thread (`safepoints`). A breakpoint's file and line are checked
  here, so a wrong one is refused at once with what is there; the file found is the reply
  (with `check`, the breakpoint is only checked: JupyterLab's panel sets it in the rank's
  debugpy);
- `Profile` (`steps`): noted for the main thread, whose profiler starts and stops at optimizer
  steps (`distnb.rank.profiling`); `ProfileReport`: how the profile stands, the profile once
  it has stopped.
"""

from __future__ import annotations

import bdb
import cmd
import linecache
import os
import pdb
import socket
import sys
import threading
import time
import traceback
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from distnb.contract import keys
from distnb.rank.agent.surface import AgentSurface
from distnb.rank.agent.tape import CORE, GROUP_NAME, MEMBERS
from distnb.rank.checked.recorder import GROUP, OP, ORIGIN, RANK, SEQ, SITE, entry_event
from distnb.rank.checked.wire import fingerprint
from distnb.records.agent import (
    AgentRequest,
    Break,
    Detach,
    Events,
    Hold,
    Profile,
    ProfileReport,
    Recorded,
    Release,
    Reply,
    Status,
    Stop,
    Taped,
    dumps_reply,
    loads_request,
)
from distnb.records.attach import AgentState, OpenCall, RankSnapshot, StackFrame
from distnb.userfiles import is_library

if TYPE_CHECKING:
    from distnb.rank.agent.safepoints import SafePoints

__all__ = ["Server", "check_line", "find_file", "main_stack", "users_frames"]

_FOREVER = timedelta(days=365)
_STRANGER_S = 0.05
_MAIN = threading.main_thread()
_OWN = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
# the debugger's own machinery, between a stopped rank's frame and distnb's: not the user's stack
_DEBUGGER = frozenset(os.path.abspath(m.__file__ or "") for m in (bdb, cmd, pdb))


class Served(AgentSurface, Protocol):
    """The agent as its server sees it: its surface, its safe points, its profiler."""

    safepoints: SafePoints | None
    profiling: Any  # distnb.rank.profiling once a profile was asked


class Server(threading.Thread):
    """See the module."""

    def __init__(self, agent: Served) -> None:
        super().__init__(name="distnb-agent", daemon=True)
        self.agent = agent

    def run(self) -> None:
        try:
            raw, store = self.agent.connect_raw()
        except RuntimeError:
            return
        rank, n = self.agent.rank, 0
        while True:
            key = keys.agent_request(rank, n)
            try:
                raw.wait([key], _FOREVER)  # unsigned: a stranger's value must not hold it
                value = store.multi_get([key])[0]  # b"": a value the run did not sign
            except RuntimeError:  # the control plane is gone: nobody can attach
                return
            if not value:  # a stranger's value, which the run's own may replace
                time.sleep(_STRANGER_S)
                if store.add(keys.agent_calls(rank), 0) > n + 1:  # a later number is out:
                    n += 1  # this one will not be the notebook's (a stranger counted up)
                continue
            store.delete_key(key)
            try:
                reply = Reply(self.handle(loads_request(value)))
            except Exception as exc:
                reply = Reply(error=f"{type(exc).__name__}: {exc}")
            try:
                store.set(keys.agent_reply(rank, n), dumps_reply(reply))
            except RuntimeError:
                return
            n += 1

    def handle(self, request: AgentRequest) -> Any:
        """The JSON-able value that answers `request`."""
        points = self.agent.safepoints
        assert points is not None
        match request:
            case Status():
                return self.snapshot().to_dict()
            case Events(last=last, after=after):
                return self.events(last, after).to_dict()
            case Stop(at=at):
                points.request_stop(at)
            case Hold():
                points.hold()
            case Release():
                points.release()
            case Break(file=name, line=line, cond=cond, check=check):
                file = find_file(name)
                check_line(file, line)
                if not check:  # the panel sets it, in debugpy
                    points.add_break(file, line, cond or None)
                return file
            case Detach():
                points.detach()
                if self.agent.profiling is not None:
                    self.agent.profiling.drop()
                    self.agent.tape.exact = False
            case Profile(steps=steps):
                from distnb.rank import profiling

                profiling.ask(steps)
                self.agent.tape.exact = True  # collectives' ends, for the profile's phases
                self.agent.profiling = profiling  # the step hook calls it from now on
            case ProfileReport(end=end):
                if self.agent.profiling is None:
                    return None
                found = self.agent.profiling.report(end)
                if found.profile is not None:
                    self.agent.tape.exact = False
                return found.to_dict()
        return None

    def snapshot(self) -> RankSnapshot:
        agent = self.agent
        tape, points = agent.tape, agent.safepoints
        assert points is not None
        state, current = points.state, None
        found = tape.current()
        if found is not None:
            entry, age = found
            current = OpenCall(
                entry[GROUP],
                entry[GROUP_NAME],
                entry[SEQ],
                entry[OP],
                _members(tape, entry),
                entry_event(entry).site,
                age,
                _fingerprint(tape, entry),
            )
            if state is AgentState.RUNNING:
                state = AgentState.COLLECTIVE
        finished = [e for e in tape.recorder.events() if e.end_ns]
        return RankSnapshot(
            rank=agent.rank,
            host=socket.gethostname(),
            pid=os.getpid(),
            state=state,
            world_size=agent.world_size,
            local_rank=agent.local_rank,
            step=agent.step,
            current=current,
            last=finished[-1] if finished else None,
            calls=tuple(sorted(tape.calls().items())),
            stack=main_stack(),
            where=points.where,
        )

    def events(self, last: int, after: int = 0) -> Taped:
        """The collectives recorded from the `after`-th on, the last `last` at most."""
        tape = self.agent.tape
        ring = tape.recorder
        count = ring.count
        start = max(0, after, count - min(last, ring.size))
        entries = (ring.ring[i % ring.size] for i in range(start, count))
        found = [Recorded(entry_event(e), _fingerprint(tape, e)) for e in entries if e is not None]
        return Taped(count, start, tuple(found))


def _members(tape: Any, entry: list[Any]) -> tuple[int, ...]:
    g = tape.groups.get(entry[GROUP_NAME])
    return tuple(g[MEMBERS]) if g is not None else ()


def _fingerprint(tape: Any, entry: list[Any]) -> Any:
    where = (entry[SITE], entry[ORIGIN])
    return fingerprint(
        (entry[CORE], where),
        rank=entry[RANK],
        group=entry[GROUP],
        seq=entry[SEQ],
        members=_members(tape, entry),
    )


def main_stack() -> tuple[StackFrame, ...]:
    """The main thread's stack, outermost first, as `users_frames` keeps it."""
    frame = sys._current_frames().get(_MAIN.ident or -1)
    return users_frames(traceback.extract_stack(frame)) if frame is not None else ()


def users_frames(stack: list[traceback.FrameSummary]) -> tuple[StackFrame, ...]:
    """`stack` (outermost first) without distnb's own frames or the debugger's (pdb, bdb, cmd:
    a stopped rank sits in them), nor the libraries they called (the standard library's
    `hmac`, as a stopped rank waits for the notebook's answer)."""
    kept, ours = [], False
    for e in stack:
        if e.filename.startswith(_OWN) or os.path.abspath(e.filename) in _DEBUGGER:
            ours = True
        elif not (ours and is_library(e.filename)):
            ours = False
            kept.append(StackFrame(e.filename, e.lineno or 0, e.name, (e.line or "").strip()))
    return tuple(kept)


def find_file(name: str) -> str:
    """The file a breakpoint names: a path, or the end of a loaded module's path."""
    if os.path.isabs(name) and os.path.exists(name):
        return name
    files = {
        os.path.abspath(f)
        for m in list(sys.modules.values())
        if (f := getattr(m, "__file__", None))
    }
    suffix = os.sep + name.lstrip("./")
    found = sorted(f for f in files if f.endswith(suffix) or f == os.path.abspath(name))
    if len(found) == 1:
        return str(found[0])
    if not found:
        raise ValueError(f"no file {name!r} is loaded on this rank: give its path")
    raise ValueError(f"{name!r} names {len(found)} loaded files ({', '.join(found)}): give more")


def check_line(file: str, line: int) -> None:
    if not linecache.getline(file, line).strip():
        raise ValueError(f"{file}:{line} is blank or past the end of the file")
