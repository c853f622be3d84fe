"""Stopping a rank of an attached job, and letting it go: the notebook's requests, carried out
on the rank's main thread at safe points.

The serving thread cannot stop the main thread itself (Python traces and debugs one thread from
inside it), so a request is noted here and carried out where the main thread passes next:

- before its next collective goes to the backend (the tape's `gate`): nothing of the
  collective has started, so no peer waits for it inside gloo or NCCL, where a timeout runs;
- after its next optimizer step (`at_step`), a step boundary;
- at once, where the main thread is (`StopAt.NOW`): the serving thread sends the main thread
  `STOP_SIGNAL`, whose handler stops it in its innermost frame of the user's code. A rank
  blocked where no collective comes (a lock, a sleep, a queue, a socket: Python's blocking
  calls give way to signal handlers, then carry on) can be looked into so. Native code that
  does not give way (inside a collective, in gloo or NCCL) runs on until it returns to Python:
  there the next collective's safe point comes first anyway.

There a rank stops in the debugger (`stop`), is held until the stopped peers go on (`hold`: a
held rank waits before its collective, not inside it), or starts tracing for breakpoints set
from the notebook (file, line, condition: pdb's breakpoints, on the main thread only). `detach`
clears all of it, overflow watches started from the notebook and the panel's debugpy tracing
included (ended at the next safe point, on the main thread). Holds and prompts end by themselves
when the notebook's lease runs out.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any

from distnb.rank.agent import frames, panel
from distnb.rank.agent.stopped import AgentAsker, AgentPdb, Lease
from distnb.rank.checked.recorder import GROUP, OP, SEQ
from distnb.records.agent import StopAt
from distnb.records.attach import AgentState
from distnb.userfiles import is_library

if TYPE_CHECKING:
    from distnb.rank.agent.surface import AgentSurface

__all__ = ["SafePoints", "user_frame"]

_PACKAGES = ("torch", "distnb")
# The signal that stops the main thread where it is: a real-time one, which neither torch nor
# the launchers use (Slurm and Lightning requeue on SIGUSR1).
STOP_SIGNAL = signal.SIGRTMIN + 6


class SafePoints:
    """The notebook's standing requests to one rank (see the module)."""

    def __init__(self, agent: AgentSurface) -> None:
        self.agent = agent
        self.lease = Lease(agent.store)
        self.state = AgentState.RUNNING
        self.where = ""  # the line the rank is stopped at
        self.stop_at: StopAt | None = None
        self.breaks: list[tuple[str, int, str | None]] = []  # to set on the main thread
        self._release = threading.Event()
        self._release.set()
        self._debugger: AgentPdb | None = None
        self._unwatch = False  # overflow watches to remove on the main thread (after detach)
        self._untrace = False  # debugpy's tracing to end on the main thread (after detach)
        self._signalled = _install(self._interrupted)  # False: the agent is off the main thread

    @property
    def armed(self) -> bool:
        return bool(
            self.stop_at
            or self.breaks
            or self._unwatch
            or self._untrace
            or not self._release.is_set()
        )

    # --- from the serving thread --------------------------------------------------------------

    def request_stop(self, at: StopAt) -> None:
        if at is StopAt.NOW and not self._signalled:
            raise RuntimeError(
                "this rank's agent started off its main thread, where no signal handler can be "
                "set: stop it at its next collective or step instead"
            )
        self.stop_at = at
        if at is StopAt.NOW:
            main = threading.main_thread().ident
            assert main is not None
            signal.pthread_kill(main, STOP_SIGNAL)
        else:
            self._arm()

    def hold(self) -> None:
        self._release.clear()
        self._arm()

    def release(self) -> None:
        """End a hold (the stopped peers have gone on)."""
        self._release.set()

    def add_break(self, file: str, line: int, cond: str | None) -> None:
        self.breaks.append((file, line, cond))
        self._arm()

    def detach(self) -> None:
        """Forget every request, release a hold, untrace at the main thread's next event."""
        self.stop_at = None
        self.breaks = []
        self._release.set()
        if self._debugger is not None:
            self._debugger.detached = True
        self.agent.tape.gate = None
        if frames.watching():  # hooks on the model: removed where the model runs
            self._unwatch = True
            self._arm()
        if "pydevd" in sys.modules:  # the panel was used: debugpy traces no more
            panel.untrace()  # this thread's; the main thread's at its next safe point
            self._untrace = True
            self._arm()

    def _arm(self) -> None:
        self.agent.tape.gate = self._gate

    # --- on the main thread -------------------------------------------------------------------

    def _gate(self, entry: list[Any]) -> None:
        __tracebackhide__ = True
        self._act(f"before {entry[OP]} #{entry[SEQ]} on {entry[GROUP]}", StopAt.COLLECTIVE)

    def at_step(self) -> None:
        self._act(f"after step {self.agent.step}", StopAt.STEP)

    def _act(self, why: str, point: StopAt) -> None:
        if self._unwatch:
            self._unwatch = False
            frames.unwatch()
        if self._untrace:
            self._untrace = False
            panel.untrace()
        frame = user_frame(sys._getframe(2))
        if frame is None:
            if not self.armed:
                self.agent.tape.gate = None
            return
        if self.breaks:
            self._trace(frame)
        if self.stop_at == point:
            self.stop_at = None
            self._stop(frame, why)
        elif not self._release.is_set():
            self._hold(why)
        if not self.armed:
            self.agent.tape.gate = None

    def _interrupted(self, signum: int, frame: FrameType | None) -> None:
        """`STOP_SIGNAL`'s handler: stop where the main thread was (see the module)."""
        __tracebackhide__ = True
        if self.stop_at is not StopAt.NOW or frame is None or self.state is AgentState.STOPPED:
            return
        self.stop_at = None
        was = f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno}"
        before = self.state, self.where  # held, it is held again once it goes on
        self._stop(innermost_user_code(frame), f"where it was (in {frame.f_code.co_name} at {was})")
        if before[0] is AgentState.HELD:
            self.state, self.where = before

    def _stop(self, frame: FrameType, why: str) -> None:
        debugger = self.debugger()
        debugger.header = f"distnb: rank {self.agent.rank} stopped {why}"
        debugger.reset()
        debugger.interaction(frame, None)
        if debugger.quitting:
            raise debugger.quit_error()
        if debugger.stoplineno != -1 or debugger.breaks:  # stepping, or breakpoints: trace on
            _trace_from(debugger, frame)

    def _hold(self, why: str) -> None:
        self.state, self.where = AgentState.HELD, why
        self.lease.renew()
        try:
            while not self._release.wait(0.1):
                if not self.lease.alive():
                    self._release.set()
        finally:
            self.state, self.where = AgentState.RUNNING, ""

    def _trace(self, frame: FrameType) -> None:
        debugger = self.debugger()
        if sys.gettrace() is None:
            debugger.reset()  # a debugger that is not tracing yet
        for file, line, cond in self.breaks:
            debugger.set_break(file, line, cond=cond)
        self.breaks = []
        _mark_frames(debugger, frame)
        debugger.set_continue()  # breakpoints only; before tracing, or it would trace itself
        sys.settrace(debugger.trace_dispatch)

    def debugger(self) -> AgentPdb:
        if self._debugger is None:
            asker = AgentAsker(self.agent.store, self.agent.rank, self.lease)
            self._debugger = AgentPdb(asker)
            self._debugger.on_stop = self._on_stop
            self._debugger.on_panel = self._to_panel
        self._debugger.detached = False
        return self._debugger

    def _to_panel(self) -> None:
        """The rank goes to JupyterLab's panel: breakpoints not set yet are the panel's now
        (the notebook sets them in debugpy); pdb tracing them would take debugpy's place."""
        self.breaks = []

    def _on_stop(self, stopped: bool, where: str) -> None:
        self.state = AgentState.STOPPED if stopped else AgentState.RUNNING
        self.where = where


def user_frame(frame: FrameType | None) -> FrameType | None:
    """The innermost frame that is neither torch's nor distnb's (where the user called in)."""
    while frame is not None:
        name = frame.f_globals.get("__name__") or ""
        if name.split(".")[0] not in _PACKAGES:
            return frame
        frame = frame.f_back
    return None


def innermost_user_code(frame: FrameType) -> FrameType:
    """The innermost frame of the user's code from `frame` outwards (a lock's wait is the
    standard library's; the line that waits is the user's), else `frame`."""
    found: FrameType | None = frame
    while found is not None:
        if not is_library(found.f_code.co_filename) and user_frame(found) is found:
            return found
        found = found.f_back
    return frame


def _install(handler: Any) -> bool:
    """`handler` for `STOP_SIGNAL`, if this is the main thread (only it may set handlers)."""
    try:
        signal.signal(STOP_SIGNAL, handler)
    except ValueError:
        return False
    return True


def _trace_from(debugger: AgentPdb, frame: FrameType) -> None:
    """Trace `frame` and its callers with `debugger`, as `Bdb.set_trace` does, keeping the
    stepping command the user gave."""
    _mark_frames(debugger, frame)
    sys.settrace(debugger.trace_dispatch)


def _mark_frames(debugger: AgentPdb, frame: FrameType) -> None:
    """`frame` and its callers traced by `debugger` once tracing is on; the outermost is its
    bottom frame."""
    bottom: FrameType | None = frame
    while bottom is not None:
        bottom.f_trace = debugger.trace_dispatch
        debugger.botframe = bottom
        bottom = bottom.f_back
