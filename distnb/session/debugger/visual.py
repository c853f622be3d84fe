"""JupyterLab's visual debugger on the ranks: the kernel relays the frontend's debug requests.

JupyterLab debugs a kernel with `debug_request` messages (the Debug Adapter Protocol in Jupyter
messages); ipykernel answers them with debugpy in the kernel's own process, where `%%allranks`
code never runs. `VisualDebugger` stands in front of ipykernel's debugger (`install`):

- Once the frontend has attached, each `%%allranks` cell first connects the kernel to every
  rank's own debugpy (`distnb.rank.debug.visual.listen`, a `dap.DapClient` each), replaying the
  frontend's breakpoints, and tells the ranks the file name the frontend knows the cell by: the
  ranks compile the cell under it, so gutter breakpoints stop them and the frontend highlights
  their line in the cell. debugpy listens on the rank's loopback (it has no authentication); a
  rank on another host is reached through the signed control plane (`distnb.contract.relay`).
- Every `%%allranks` cell, debugger on or off, is run on the ranks under the file name the
  frontend knows the cell by (`cell_file`: ipykernel's name for the raw cell), so a frame in a
  function of any earlier cell shows in that cell; the relay answers `source` for those files.
- A rank's threads, frames and variables reach the frontend under ids of their own (`ids`): a
  request naming such an id goes to that rank; every other request is ipykernel's, as before.
  Threads are `rank r` (the main thread) or `rank r: name`, frames `[rank r] name`; tensors
  show dtype, shape, device and a preview, and expand to a clean list (`variables`).
- A rank's `stopped` event marks it stopped in the control plane (a `STOPPED` beacon, as the
  text debugger leaves: peers waiting for it at collectives wait on, with no timeout and no
  hang report) and stops the cell's clock while any rank is stopped (`stopped_seconds`). The
  panel shows one rank at a time and never changes rank on its own (`panel`).
- The panel and the kernel agree. Switching the debugger off (`disconnect`) lets stopped ranks
  go on and forgets every breakpoint, in ipykernel and on the ranks. JupyterLab's *Terminate*
  (the square) is `disconnect` followed at once by `initialize`, `attach` and the breakpoints
  again; whether its bug icon goes off with the `disconnect` depends on the page's history
  (JupyterLab 4.6): only when it showed the notebook again with the debugger on (its
  `debugInfo` answered "started", other than the one after a `dumpCell`, which sets a
  breakpoint) does the icon go off, and the gutter with it; the debugger switched on from a
  page that showed it off keeps its icon lit and its gutter. So the relay follows the icon
  (`_restarting`): it lets the restart through where the icon stays lit (the debugger stays on,
  with the breakpoints the gutter shows again) and refuses it where the icon goes off (the
  kernel is off too; one click on the bug icon switches it on again).
- A rank whose adapter goes away (it died, the cluster stopped) is dropped, and if the panel
  showed it, the next stopped rank is shown.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import threading
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from distnb.contract import keys
from distnb.records.beacon import Beacon, BeaconState
from distnb.session.debugger import links
from distnb.session.debugger.cells import CellFiles
from distnb.session.debugger.dap import DapClient, DapError
from distnb.session.debugger.ids import RESUMING, ROUTED, decode, encode, kernels
from distnb.session.debugger.panel import Panel
from distnb.session.debugger.variables import LISTED, Variables
from distnb.session.load import stretched

if TYPE_CHECKING:
    from distnb.records.cell import RankInfo
    from distnb.session.cluster import Cluster
    from distnb.session.control import ControlPlane

__all__ = ["VisualDebugger", "active", "cell_file", "install", "uninstall"]

Message = dict[str, Any]

# An `initialize` this soon after a `disconnect` that let stopped threads go, with no request
# between: JupyterLab's restart (its Terminate, enabled only while a thread is stopped), not a
# user switching the debugger on (JupyterLab asks `debugInfo` first).
RESTART_S = 2.0
TERMINATED = (
    "distnb: Terminate let the stopped ranks go on and switched the debugger off, as the panel "
    "shows it; click the bug icon to switch it on again"
)

# A file to append the frontend's debug requests and the answers' success to, one line each
# (`DISTNB_DAP_LOG=/tmp/dap.log jupyter lab`): how to see what a frontend sends.
_LOG = os.environ.get("DISTNB_DAP_LOG", "")

_active: VisualDebugger | None = None


def install(shell: Any) -> VisualDebugger | None:
    """Stand in front of the kernel's debugger (None where the kernel has none: a terminal)."""
    global _active
    debugger = getattr(getattr(shell, "kernel", None), "debugger", None)
    if debugger is None or not hasattr(debugger, "process_request"):
        return None
    if _active is None:
        _unwrapped_children()
        _active = VisualDebugger(shell, debugger)
    return _active


def _unwrapped_children() -> None:
    """Keep the kernel's debugpy from wrapping the processes the kernel starts (controller,
    engines): each would start a debugger of its own that nothing attaches to, and outlive
    the cluster. Only possible before the kernel's debugger first starts (`%load_ext distnb`
    before switching the debugger on; otherwise start the cluster with the debugger off)."""
    import debugpy

    with contextlib.suppress(Exception):  # already listening: too late to configure
        debugpy.configure(subProcess=False)


def uninstall() -> None:
    global _active
    if _active is not None:
        _active.close()
        _active.debugger.process_request = _active.own
        _active.shell.events.unregister("pre_run_cell", _active.cells.remember)
        _active = None


def active() -> VisualDebugger | None:
    """The relay, while the frontend's debugger is attached."""
    return _active if _active is not None and _active.attached else None


def cell_file() -> str:
    """The file name the frontend's debugger knows the running `%%allranks` cell by ("" outside
    a Jupyter kernel, or for code that is not such a cell)."""
    return _active.cells.current() if _active is not None else ""


class VisualDebugger:
    def __init__(self, shell: Any, debugger: Any) -> None:
        self.shell = shell
        self.debugger = debugger
        self.own = debugger.process_request
        debugger.process_request = self.process_request
        self.cells = CellFiles()
        shell.events.register("pre_run_cell", self.cells.remember)
        self.attached = False
        self.breakpoints: dict[str, list[Message]] = {}  # source path -> as the frontend set
        self.clients: dict[int, DapClient] = {}
        self.stopped: dict[int, Message] = {}  # rank -> its stopped event's body (own ids)
        self.resumed_by: dict[int, str] = {}
        self.panel = Panel(lambda: dict(self.stopped), self._emit, self._waits_for_stopped)
        self.frames: dict[tuple[int, int], int] = {}  # (rank, variables ref) -> its frame
        self.variables = Variables()
        self.control: ControlPlane | None = None
        self.run_id = 0
        self._lock = threading.Lock()
        self._stopped_s = 0.0
        self._since: float | None = None
        self._disconnected_at: float | None = None  # nothing asked since the last disconnect
        self._previous = ""  # the frontend's previous request
        self._icon_follows = False  # its bug icon goes off at the next disconnect
        self._icon_off = False  # it went off at the last one

    # --- the frontend's requests ---------------------------------------------------------

    async def process_request(self, message: Message) -> Message:
        reply = await self._process(message)
        if _LOG:
            with open(_LOG, "a", encoding="utf-8") as log:
                args = json.dumps(message.get("arguments") or {})[:120]
                log.write(
                    f"{time.time():.3f} {message.get('command')} {args} -> {reply.get('success')}\n"
                )
        return reply

    async def _process(self, message: Message) -> Message:
        command = message.get("command", "")
        args = message.get("arguments") or {}
        previous, self._previous = self._previous, command
        if self._restarting(command):
            return _refused(message, TERMINATED)
        key = ROUTED.get(command)
        thread = args.get(key) if key == "threadId" else None
        if isinstance(thread, int) and self._rank_shown():
            # JupyterLab names the first thread of its set of stopped threads, but its Continue
            # takes that one out first and then names the next (another stopped rank's, which
            # `debugInfo` listed, or thread 1): Continue is always for the rank shown. After the
            # user selected another rank's frame it still names the one it showed before.
            to_shown = kernels(thread) or command == "continue"
            shown = self.panel.shown if to_shown else self.panel.route(thread)
            args = message["arguments"] = {**args, key: shown}
        source = self.cells.source(message) if command == "source" else None
        if source is not None:
            return source
        if key is not None and isinstance(args.get(key), int):
            rank, own = decode(args[key])
            if rank is not None:
                routed: Message = await _off_loop(self._to_rank, rank, message, key, own)
                return routed
        was_stopped = bool(self.stopped) or bool(getattr(self.debugger, "stopped_threads", ()))
        reply: Message = await self.own(message)
        if command == "attach" and reply.get("success"):
            self.attached = True
        elif command == "setBreakpoints":
            path = args.get("source", {}).get("path", "")
            self.breakpoints[path] = list(args.get("breakpoints", []))
            await _off_loop(links.set_breakpoints, dict(self.clients), path, self.breakpoints[path])
        elif command == "threads" and self.clients:
            threads = await _off_loop(links.threads, dict(self.clients))
            reply.setdefault("body", {}).setdefault("threads", []).extend(threads)
        elif command == "debugInfo":
            body = reply.setdefault("body", {})
            body.setdefault("stoppedThreads", []).extend(self.panel.threads())
            if body.get("isStarted") and previous != "dumpCell":
                self._icon_follows = True  # the page showed the notebook again, debugger on
        elif (
            command == "disconnect"
        ):  # as ipykernel, forget the breakpoints: a new attach sets them
            self.attached = False
            self.breakpoints.clear()
            await _off_loop(self.close)
            self._disconnected_at = time.monotonic() if was_stopped else None
            self._icon_off, self._icon_follows = self._icon_follows, False
        return reply

    def _restarting(self, command: str) -> bool:
        """Whether `command` is the `initialize` of JupyterLab's restart (its Terminate) after
        which its bug icon shows the debugger off (see the module's docstring)."""
        since, self._disconnected_at = self._disconnected_at, None
        restart = (
            command == "initialize" and since is not None and time.monotonic() - since < RESTART_S
        )
        return restart and self._icon_off

    def _to_rank(self, rank: int, message: Message, key: str, own: int) -> Message:
        command = message["command"]
        client = self.clients.get(rank)
        reply: Message = {
            "type": "response",
            "request_seq": message.get("seq", 0),
            "command": command,
            "success": False,
        }
        if client is None or client.closed:
            reply["message"] = f"rank {rank} is not connected to the debugger"
            return reply
        args = {**message.get("arguments", {}), key: own}
        if command == "variables" and own & LISTED:  # a tensor's list, the relay's own
            listed = self.variables.listed(client, rank, own)
            reply.update(success=listed is not None, body={"variables": listed or []})
            return reply
        if command in RESUMING:
            self._mark_running(rank)
            self.resumed_by[rank] = command
        elif command == "scopes":
            self.panel.switch(rank)  # the user selected this rank's frame
        try:
            body = client.request(command, args)
        except DapError as exc:
            reply["message"] = str(exc)
            return reply
        reply.update(success=True, body=self._rewrite(rank, command, args, body))
        return reply

    def _rewrite(self, rank: int, command: str, args: Message, body: Any) -> Any:
        if command == "stackTrace":
            for frame in body.get("stackFrames", []):
                frame["name"] = f"[rank {rank}] {frame['name']}"
                frame["id"] = encode(rank, frame["id"])
            if self.panel.rank() == rank:
                held = self._held_frames(rank, self.panel.listing())
                body["stackFrames"] = body.get("stackFrames", []) + held
        elif command == "scopes":
            for scope in body.get("scopes", []):
                self._variables_of(rank, scope, args["frameId"])
        elif command == "variables":
            frame = self.frames.get((rank, args["variablesReference"]))
            accept = getattr(self.debugger, "accept_variable", lambda name: True)
            body["variables"] = [v for v in body.get("variables", []) if accept(v["name"])]
            if frame is not None:
                self.variables.present(self.clients[rank], rank, frame, body["variables"])
            for variable in body["variables"]:
                self._variables_of(rank, variable, frame)
        elif command in ("evaluate", "setExpression", "setVariable"):
            self._variables_of(rank, body, args.get("frameId"))
        return body

    def _held_frames(self, shown: int, listed: set[int]) -> list[Message]:
        """The top frame of every other stopped rank, below the shown rank's stack (each rank
        added to `listed`): selecting one shows that rank (`Panel.switch`)."""
        frames = []
        for rank, stop in sorted(self.stopped.items()):
            client = self.clients.get(rank)
            if rank == shown or client is None:
                continue
            try:
                found = client.request("stackTrace", {"threadId": stop["threadId"], "levels": 1})
            except DapError:
                continue
            for frame in found.get("stackFrames", [])[:1]:
                frame["name"] = f"[rank {rank}] {frame['name']} (select to show)"
                frame["id"] = encode(rank, frame["id"])
                frames.append(frame)
                listed.add(rank)
        return frames

    def _variables_of(self, rank: int, holder: Message, frame: int | None) -> None:
        ref = holder.get("variablesReference", 0)
        if ref:
            if frame is not None:
                self.frames[(rank, ref)] = frame
            holder["variablesReference"] = encode(rank, ref)

    # --- the ranks -----------------------------------------------------------------------

    def begin_run(
        self, cluster: Cluster, targets: list[RankInfo], control: ControlPlane, run_id: int
    ) -> None:
        """A cell is about to run on `targets`: connect to the ranks not yet connected and
        tell them the cell's file name."""
        self.control, self.run_id = control, run_id
        self.panel.listen()
        for info in targets:
            client = self.clients.get(info.rank)
            if client is not None and not client.closed:
                continue
            try:
                self.clients[info.rank] = links.connect(
                    info,
                    cluster.view(info.engine_id),
                    control,
                    self.breakpoints,
                    partial(self.on_event, info.rank),
                )
            except (DapError, OSError) as exc:  # the cell runs; this rank just does not stop
                self.clients.pop(info.rank, None)
                print(
                    f"distnb: JupyterLab's debugger cannot reach rank {info.rank}: {exc}",
                    file=sys.stderr,
                )

    def on_event(self, rank: int, event: Message) -> None:
        name = event.get("event")
        body = dict(event.get("body") or {})
        if name == "stopped" and "threadId" in body:
            self._mark_stopped(rank, body)
            self.panel.stopped(rank, body)
        elif name == "continued" and "threadId" in body:
            self._mark_running(rank)
            self.panel.continued(rank, self.resumed_by.pop(rank, ""))
        elif name in ("distnb.closed", "terminated", "exited"):  # the rank or its adapter went
            # the socket is the adapter's to close (the client's reader closes it then): debugpy
            # sends `terminated` just before its answer to `disconnect`, and an adapter that
            # cannot write that answer exits (os._exit), leaving the rank unreachable for good
            self.clients.pop(rank, None)
            self._mark_running(rank, beacon=False)
            self.panel.continued(rank, "")

    def _rank_shown(self) -> bool:
        """Whether the frontend shows a stopped rank, and no thread of the kernel's own is
        stopped (a cell of the kernel's)."""
        kernel_stopped = bool(getattr(self.debugger, "stopped_threads", ()))
        return self.panel.shown is not None and not kernel_stopped

    def _waits_for_stopped(self, rank: int) -> bool:
        """Whether `rank` says (its beacon) that it waits at a checked call for a stopped rank:
        a step over a collective that needs a rank the panel holds."""
        control, stopped = self.control, set(self.stopped)
        if control is None or control.store is None:
            return False
        try:
            beacons = control.beacons([rank])
        except (RuntimeError, ValueError):  # the control plane is going; a torn value
            return False
        return any(b.waiting and stopped & set(b.waiting_for) for b in beacons)

    def _emit(self, event: str, body: Message) -> None:
        self.debugger.event_callback({"type": "event", "event": event, "seq": 0, "body": body})

    def _mark_stopped(self, rank: int, body: Message) -> None:
        with self._lock:
            if not self.stopped:
                self._since = time.monotonic()
            self.stopped[rank] = body
        self._beacon(rank, BeaconState.STOPPED)

    def _mark_running(self, rank: int, beacon: bool = True) -> None:
        """The rank goes on: its frames and variables are gone, the frontend no longer shows it."""
        with self._lock:
            if self.stopped.pop(rank, None) is None:
                return
            self.frames = {key: f for key, f in self.frames.items() if key[0] != rank}
            self.variables.forget(rank)
            if not self.stopped and self._since is not None:
                self._stopped_s += time.monotonic() - self._since
                self._since = None
        if beacon:
            self._beacon(rank, BeaconState.RUNNING)

    def _beacon(self, rank: int, state: BeaconState) -> None:
        if self.control is not None:
            value = Beacon(rank, state, self.run_id, time=time.time()).to_json()
            self.control.store.set(keys.beacon(rank), value)

    def stopped_seconds(self) -> float:
        """How long at least one rank has been stopped, all together: not the cell's time."""
        with self._lock:
            now = time.monotonic() - self._since if self._since is not None else 0.0
            return self._stopped_s + now

    def close(self) -> None:
        """Let stopped ranks go on and end every connection to the ranks. The frontend is told
        nothing meanwhile: it has switched the debugger off (a rank shown as it is let go would
        leave the panel showing a rank that runs, and answer requests the frontend did not
        mean)."""
        self.panel.quiet()
        wait_s = stretched(5.0, 30.0)  # ranks answer late on a loaded machine: wait for them
        for rank in sorted(self.stopped):
            client = self.clients.get(rank)
            thread = self.stopped[rank].get("threadId", 0)
            self._mark_running(rank)
            if client is not None and not client.closed:
                with contextlib.suppress(DapError):
                    client.request("continue", {"threadId": thread}, timeout=wait_s)
        for client in list(self.clients.values()):
            if not client.closed:  # a proper goodbye: the rank's adapter takes the next client
                with contextlib.suppress(DapError):
                    client.request("disconnect", {"terminateDebuggee": False}, timeout=wait_s)
            client.close()
        self.clients.clear()


def _refused(message: Message, why: str) -> Message:
    return {
        "type": "response",
        "request_seq": message.get("seq", 0),
        "command": message.get("command", ""),
        "success": False,
        "message": why,
    }


async def _off_loop(fn: Any, *args: Any) -> Any:
    """Run a blocking exchange with the ranks off the kernel's control loop."""
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
