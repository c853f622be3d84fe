"""A stopped rank of an attached job shown in JupyterLab's debugger panel: debugpy, on request.

The kernel's relay for JupyterLab's visual debugger (`distnb.session.debugger.visual`) talks to
a debugpy on each rank. A rank of an attached job starts one only when the notebook asks, from
the debugger prompt it is stopped at (`stopped.AgentPdb`): an agent never asked never imports
debugpy, so its idle cost is unchanged.

- `listen` (the notebook's `Call` of `Listen`, on the main thread): debugpy's adapter on
  loopback, as on distnb's own ranks (`distnb.rank.debug.visual.listen`: debugpy has no
  authentication, so it never listens on a network), without following the job's child
  processes (a data loader's workers stay as they would have been);
- `suspend` (the notebook's `Panel` answer): pdb lets go of the rank, which suspends in debugpy
  at the frame and line it is stopped at; the panel steps and continues it from there. Each
  suspension marks the rank stopped (`on_stop`), as at pdb's prompt: the notebook's status
  says so, and the notebook holds its peers before their next collective;
- `relay` (a rank on another host than the notebook's; `Call` of `RelayTo`): its adapter's
  connection carried over the job's signed control plane (`distnb.contract.relay`, as for
  distnb's own ranks on other hosts), on store connections of the agent's (`serve_with`);
- `untrace` (after `detach`, at the main thread's next safe point): debugpy stops tracing the
  rank, which runs on untraced, as it would have.
"""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from distnb.records.agent import Listening

__all__ = ["listen", "relay", "serve_with", "suspend", "untrace"]

OnStop = Callable[[bool, str], None]

_connect: list[Callable[[], Any]] = []  # the agent's: a new signed client of the job's store


def serve_with(connect: Callable[[], Any]) -> None:
    """Relays (`relay`) use `connect` for their store connections (the agent's, at its start)."""
    _connect[:] = [connect]


def listen() -> Listening:
    """This rank's debug adapter (started on first call): its address, and the folders whose
    frames are not the user's."""
    import debugpy

    from distnb.rank.debug.visual import listen as start

    if "pydevd" not in sys.modules:  # before the adapter starts: children stay undebugged
        debugpy.configure(subProcess=False)
    host, port, folders = start()
    return Listening(host, port, tuple(folders))


def relay(channel: str) -> None:
    """Connect this rank's adapter to the kernel over the job's control plane, on `channel`
    (the kernel's end is relaying already)."""
    from distnb.contract.relay import Relay

    where = listen()
    sock = socket.create_connection((where.host, where.port), timeout=10)
    sock.settimeout(None)
    Relay(sock, channel, "kernel", (_connect[0](), _connect[0]()))


def suspend(frame: FrameType, on_stop: OnStop) -> None:
    """Suspend this (the main) thread in debugpy at `frame`'s current line until the panel lets
    it go on; its later stops there are reported through `on_stop` too."""
    from distnb.rank.debug.visual import suspend_at

    _reported(on_stop)
    suspend_at(frame)


def _reported(on_stop: OnStop) -> None:
    """Each suspension of the main thread by debugpy calls `on_stop(True, where)` before and
    `on_stop(False, "")` after (once per process: the agent's safe points are one)."""
    py_db = sys.modules["pydevd"].get_global_debugger()
    wait = py_db.do_wait_suspend
    if getattr(wait, "_agent", False):
        return
    main = threading.main_thread()

    def do_wait_suspend(thread: Any, frame: FrameType, *args: Any, **kwargs: Any) -> Any:
        if thread is not main:
            return wait(thread, frame, *args, **kwargs)
        on_stop(True, f"{frame.f_code.co_filename}:{frame.f_lineno}")
        try:
            return wait(thread, frame, *args, **kwargs)
        finally:
            on_stop(False, "")

    do_wait_suspend._agent = True  # type: ignore[attr-defined]
    py_db.do_wait_suspend = do_wait_suspend


def untrace() -> None:
    """Stop debugpy's tracing of this thread and of threads started from now on (the notebook
    has detached; its breakpoints are gone with the panel's connection)."""
    if "pydevd" in sys.modules:
        sys.settrace(None)
        threading.settrace(None)
