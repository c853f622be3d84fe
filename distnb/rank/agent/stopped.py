"""A stopped rank of an attached job: distnb's rank debugger, its prompts and output in the
notebook, and the lease that resumes the rank when the notebook is gone.

`AgentPdb` is the rank debugger of distnb's own ranks (`distnb.rank.debug.debugger.RankPdb`:
pdb's commands, the user's frames only) with what an attached job needs besides:

- what it prints while the rank is stopped goes to the notebook (`Out`: pieces in the store,
  counted, so the notebook shows all of them before the next prompt), not to the job's log;
- the notebook's own answers (`distnb.records.agent.PromptAnswer`, told from the pdb commands
  the user types by `read_answer`): `Execute` runs code in the stopped frame and shows its output
  (an `%%allranks` cell on stopped ranks); `Call` answers a `FrameQuery` with a record over the
  frame's names (`frames`: shapes, replica digests, the overflow tracer) under
  `keys.agent_result`; `Detach` clears every breakpoint and overflow watch started from the
  notebook and lets the rank run on as if it had never stopped; `Panel` hands the rank to
  JupyterLab's debugger panel (`panel`: it suspends in debugpy where it is stopped);
- the wait for an answer watches the notebook's lease (`Lease`): when it stops moving for
  `LEASE_S`, or the store is gone, the answer is `Detach`. A notebook that dies leaves the job
  running.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections import ChainMap
from typing import Any, cast

from torch.distributed import DistStoreError

from distnb.contract import keys
from distnb.rank.agent import frames, panel
from distnb.rank.debug.ask import POLL_S, Asker
from distnb.rank.debug.debugger import RankPdb
from distnb.records.agent import (
    PROMPT_MARK,
    Call,
    Detach,
    Execute,
    Panel,
    Reply,
    answer_line,
    dumps_reply,
    read_answer,
)

__all__ = ["LEASE_S", "AgentAsker", "AgentPdb", "Lease", "Out"]

LEASE_EVERY_S = 0.1  # how often a waiting rank looks at the notebook's lease
LEASE_S = 10.0  # a notebook silent this long is gone


class Lease:
    """Whether the attached notebook still counts its lease up (by this rank's own clock)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._last = b""
        self._seen = time.monotonic()

    def renew(self) -> None:
        """Start a wait: the notebook is taken as present now."""
        self._seen = time.monotonic()

    def alive(self) -> bool:
        try:
            if self.store.check([keys.AGENT_LEASE]):
                value = self.store.multi_get([keys.AGENT_LEASE])[0]
                if value and value != self._last:
                    self._last, self._seen = value, time.monotonic()
        except (RuntimeError, DistStoreError):  # the store is gone, and with it the notebook
            return False
        return time.monotonic() - self._seen < LEASE_S


class Out:
    """A stopped rank's stdout and stderr: pieces in the store (`keys.agent_out`), counted."""

    def __init__(self, store: Any, rank: int) -> None:
        self.store, self.rank = store, rank
        self.written = 0  # what `Asker` reads to say how much the notebook should show
        self._pieces = 0
        self._buffer: list[str] = []

    def write(self, text: str) -> int:
        self._buffer.append(text)
        self.written += len(text)
        return len(text)

    def flush(self) -> None:
        if self._buffer:
            text, self._buffer = "".join(self._buffer), []
            self.store.set(keys.agent_out(self.rank, self._pieces), text)
            self._pieces += 1
            # where a notebook that attaches later starts reading: (pieces, characters)
            self.store.set(keys.agent_out_count(self.rank), f"{self._pieces} {self.written}")

    def isatty(self) -> bool:
        return False


class AgentAsker(Asker):
    """`Asker` whose wait gives up (answering `Detach`) when the notebook's lease runs out."""

    def __init__(self, store: Any, rank: int, lease: Lease) -> None:
        super().__init__(store, rank)
        self.lease = lease

    def _wait(self, key: str) -> str:
        self.lease.renew()
        lease_due = time.monotonic() + LEASE_EVERY_S
        while True:
            try:
                if self.store.check([key]):
                    value: bytes = self.store.get(key)
                    self.store.delete_key(key)
                    return value.decode()
            except RuntimeError:  # the control plane is gone
                return answer_line(Detach())
            if time.monotonic() >= lease_due:  # the lease costs two round trips: not every poll
                if not self.lease.alive():
                    return answer_line(Detach())
                lease_due = time.monotonic() + LEASE_EVERY_S
            time.sleep(POLL_S)  # polled: a store wait's timeout writes a line to the job's stderr


class AgentPdb(RankPdb):
    """The debugger of a rank of an attached job (see the module). `detached` is set by the
    serving thread: the main thread then stops tracing at its next event."""

    def __init__(self, asker: AgentAsker) -> None:
        super().__init__(asker, lambda filename: None)
        self.out = Out(asker.store, asker.rank)
        self.detached = False
        self.on_stop: Any = None  # called with (stopped: bool, where: str) around each prompt
        self.header = ""  # said once, before the next prompt
        self.handed = False  # the rank was handed to the panel in this trace event
        self.on_panel: Any = None  # called as the rank is handed to the panel
        self._frame: Any = None  # the frame the rank stopped in

    def interaction(self, frame: Any, tb: Any) -> None:
        saved = sys.stdout, sys.stderr, self.stdout
        sys.stdout = sys.stderr = self.stdout = self.out  # type: ignore[assignment]
        where = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else ""
        self._frame, self.handed = frame, False
        if self.on_stop is not None:
            self.on_stop(True, where)
        if self.header:
            self.message(self.header)
            self.header = ""
        try:
            super().interaction(frame, tb)
        finally:
            self.out.flush()
            sys.stdout, sys.stderr, self.stdout = saved
            if self.on_stop is not None:
                self.on_stop(False, "")

    def precmd(self, line: str) -> str:
        # pdb splits a line at `;;` and expands aliases: the notebook's answers go through whole
        return line if line.startswith(PROMPT_MARK) else str(super().precmd(line))

    def onecmd(self, line: str) -> bool:
        try:
            answer = read_answer(line)
        except ValueError as exc:  # a notebook of another distnb: the rank stays stopped
            self.error(str(exc))
            return False
        match answer:
            case None:  # a pdb command the user typed
                return bool(super().onecmd(line))
            case Detach():
                self.detach()
                return True
            case Panel():
                self.to_panel()
                return True
            case Execute(code=code):
                self._run(code)
            case Call() as call:
                self._call(call)
        return False

    def detach(self) -> None:
        frames.unwatch()
        self.clear_all_breaks()
        self.set_continue()
        sys.settrace(None)

    def to_panel(self) -> None:
        """pdb lets go (its breakpoints were copied to the panel by the notebook) and the rank
        suspends in debugpy where it stopped, until the panel lets it go on."""
        self.clear_all_breaks()
        self.set_continue()  # no breakpoints: pdb's tracing ends
        if self.on_panel is not None:
            self.on_panel()
        self.handed = True
        self.out.flush()
        panel.suspend(self._frame, self.on_stop)

    def trace_dispatch(self, frame: Any, event: str, arg: Any) -> Any:
        __tracebackhide__ = True
        if self.detached:
            self.detached = False
            self.detach()
            return None
        found = super().trace_dispatch(frame, event, arg)
        if self.handed:  # None keeps the frame's tracer debugpy's: `next` stops in it
            self.handed = False
            return None
        return found

    def _call(self, call: Call) -> None:
        """Answer a `Call` with a record over the current frame's names (see `frames`)."""
        frame = self.curframe
        assert frame is not None
        # the frame's locals over its globals; what is bound goes to its locals, which the
        # trace function's return writes back into the frame, as with pdb's own `!x = 1`
        names = ChainMap(cast("dict[str, Any]", self.curframe_locals), frame.f_globals)
        try:
            reply = Reply(frames.call(call.query, names, self.asker.rank))
        except Exception as exc:
            reply = Reply(error=f"{type(exc).__name__}: {exc}")
        key = keys.agent_result(self.asker.rank, call.reply)
        self.asker.store.set(key, dumps_reply(reply))

    def _run(self, code: str) -> None:
        """Execute `code` in the current frame, as a notebook cell: its last expression shown."""
        frame = self.curframe
        assert frame is not None
        names = frame.f_globals
        local = self.curframe_locals
        try:
            try:
                compiled = compile(code, "<notebook>", "eval")
            except SyntaxError:
                exec(compile(code, "<notebook>", "exec"), names, local)
            else:
                value = eval(compiled, names, local)
                if value is not None:
                    print(repr(value))
        except Exception as exc:
            print("".join(traceback.format_exception_only(type(exc), exc)).rstrip())
