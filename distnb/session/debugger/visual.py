"""JupyterLab's visual debugger on the ranks: the kernel relays the frontend's debug requests.

JupyterLab debugs a kernel with `debug_request` messages (the Debug Adapter Protocol in Jupyter
messages); ipykernel answers them with debugpy in the kernel's own process, where `%%allranks`
code never runs. `VisualDebugger` stands in front of ipykernel's debugger (`install`):

- Once the frontend has attached, each `%%allranks` cell first connects the kernel to every
  rank's own debugpy (`distnb.rank.debug.visual.listen`, a `dap.DapClient` each), replaying the
  frontend's breakpoints, and tells the ranks the file name the frontend knows the cell by: the
  ranks compile the cell under it, so gutter breakpoints stop them and the frontend highlights
  their line in the cell. debugpy listens on the rank's loopback (it has no authentication); a
  rank on another host is reached through the signed control plane (`distnb.rank.debug.relay`).
- A rank's threads, frames and variables reach the frontend under ids of their own (`ids`): a
  request naming such an id goes to that rank; every other request is ipykernel's, as before.
  Threads are `rank r` (the main thread) or `rank r: name`, frames `[rank r] name`; tensors
  show dtype, shape and device before their value.
- A rank's `stopped` event reaches the frontend as the kernel's own would. The rank is marked
  stopped in the control plane (a `STOPPED` beacon, as the text debugger leaves: peers waiting
  for it at collectives wait on, with no timeout and no hang report) and the cell's clock stops
  while any rank is stopped (`stopped_seconds`). A rank is marked running before it is told to
  go on; when `continue` leaves other ranks stopped, the frontend is shown the next of them.
- When the frontend disconnects, stopped ranks are continued and the connections closed; a rank
  whose adapter goes away (it died, the cluster stopped) is dropped, and if it was stopped the
  frontend is told it continued.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from distnb import keys
from distnb.records.beacon import Beacon, BeaconState
from distnb.session.debugger import links
from distnb.session.debugger.dap import DapClient, DapError
from distnb.session.debugger.ids import RESUMING, ROUTED, decode, encode, kernels

if TYPE_CHECKING:
    from distnb.records.cell import RankInfo
    from distnb.session.cluster import Cluster
    from distnb.session.control import ControlPlane

__all__ = ["VisualDebugger", "active", "install", "uninstall"]

Message = dict[str, Any]

_TENSORS = {"Tensor", "Parameter", "DTensor"}

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
        _active.shell.events.unregister("pre_run_cell", _active._remember_cell)
        _active = None


def active() -> VisualDebugger | None:
    """The relay, while the frontend's debugger is attached."""
    return _active if _active is not None and _active.attached else None


class VisualDebugger:
    def __init__(self, shell: Any, debugger: Any) -> None:
        self.shell = shell
        self.debugger = debugger
        self.own = debugger.process_request
        debugger.process_request = self.process_request
        shell.events.register("pre_run_cell", self._remember_cell)
        self.attached = False
        self.raw_cell = ""
        self.breakpoints: dict[str, list[Message]] = {}  # source path -> as the frontend set
        self.clients: dict[int, DapClient] = {}
        self.stopped: dict[int, Message] = {}  # rank -> its stopped event's body (own ids)
        self.resumed_by: dict[int, str] = {}
        self.shown: int | None = None  # the rank's thread the frontend shows, while stopped
        self.frames: dict[tuple[int, int], int] = {}  # (rank, variables ref) -> its frame
        self.control: ControlPlane | None = None
        self.run_id = 0
        self._lock = threading.Lock()
        self._stopped_s = 0.0
        self._since: float | None = None

    # --- the frontend's requests ---------------------------------------------------------

    async def process_request(self, message: Message) -> Message:
        command = message.get("command", "")
        args = message.get("arguments") or {}
        key = ROUTED.get(command)
        thread = args.get(key) if key == "threadId" else None
        if isinstance(thread, int) and kernels(thread) and self._rank_shown():
            # JupyterLab names the thread it shows only while it is in its set of stopped
            # threads; its Continue takes it out first and then asks for thread 1
            args = message["arguments"] = {**args, key: self.shown}
        if key is not None and isinstance(args.get(key), int):
            rank, own = decode(args[key])
            if rank is not None:
                routed: Message = await _off_loop(self._to_rank, rank, message, key, own)
                return routed
        reply: Message = await self.own(message)
        if command == "attach" and reply.get("success"):
            self.attached = True
        elif command == "setBreakpoints":
            path = args.get("source", {}).get("path", "")
            self.breakpoints[path] = list(args.get("breakpoints", []))
            await _off_loop(self._set_breakpoints, path)
        elif command == "threads" and self.clients:
            threads = await _off_loop(self._threads)
            reply.setdefault("body", {}).setdefault("threads", []).extend(threads)
        elif command == "debugInfo":
            stopped = [encode(r, b.get("threadId", 0)) for r, b in list(self.stopped.items())]
            reply.setdefault("body", {}).setdefault("stoppedThreads", []).extend(stopped)
        elif (
            command == "disconnect"
        ):  # as ipykernel, forget the breakpoints: a new attach sets them
            self.attached = False
            self.breakpoints.clear()
            await _off_loop(self.close)
        return reply

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
        if command in RESUMING:
            self._mark_running(rank)
            self.resumed_by[rank] = command
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
        elif command == "scopes":
            for scope in body.get("scopes", []):
                self._variables_of(rank, scope, args["frameId"])
        elif command == "variables":
            frame = self.frames.get((rank, args["variablesReference"]))
            accept = getattr(self.debugger, "accept_variable", lambda name: True)
            body["variables"] = [v for v in body.get("variables", []) if accept(v["name"])]
            for variable in body["variables"]:
                if variable.get("type") in _TENSORS and frame is not None:
                    described = self._tensor(rank, frame, variable)
                    if described:  # the tree shows an expandable value's type: say it there too
                        variable["type"] = f"{variable['type']} {described}"
                        variable["value"] = f"{described}  {variable.get('value', '')}"
                self._variables_of(rank, variable, frame)
        elif command in ("evaluate", "setExpression", "setVariable"):
            self._variables_of(rank, body, args.get("frameId"))
        return body

    def _variables_of(self, rank: int, holder: Message, frame: int | None) -> None:
        ref = holder.get("variablesReference", 0)
        if ref:
            if frame is not None:
                self.frames[(rank, ref)] = frame
            holder["variablesReference"] = encode(rank, ref)

    def _tensor(self, rank: int, frame: int, variable: Message) -> str:
        """`float32[16, 3] cpu`: a tensor's dtype, shape and device ("" if unknown)."""
        name = variable.get("evaluateName")
        if not name:
            return ""
        expression = f"'%s%s %s' % (str({name}.dtype)[6:], list({name}.shape), {name}.device)"
        try:
            body = self.clients[rank].request(
                "evaluate", {"expression": expression, "frameId": frame, "context": "watch"}
            )
        except (DapError, KeyError):
            return ""
        return str(body.get("result", "")).strip("'")

    def _threads(self) -> list[Message]:
        threads = []
        for rank, client in sorted(self.clients.items()):
            try:
                found = client.request("threads").get("threads", [])
            except DapError:
                continue
            for thread in found:
                own = thread["name"]
                if own.startswith(("distnb", "Thread-", "pydevd", "IPythonHistory")):
                    continue
                name = f"rank {rank}" if own == "MainThread" else f"rank {rank}: {own}"
                threads.append({"id": encode(rank, thread["id"]), "name": name})
        return threads

    def _set_breakpoints(self, path: str) -> None:
        for client in list(self.clients.values()):
            with contextlib.suppress(DapError):  # a rank that went: dropped as its link ends
                client.request(
                    "setBreakpoints",
                    {"source": {"path": path}, "breakpoints": self.breakpoints[path]},
                )

    # --- the ranks -----------------------------------------------------------------------

    def begin_run(
        self, cluster: Cluster, targets: list[RankInfo], control: ControlPlane, run_id: int
    ) -> None:
        """A cell is about to run on `targets`: connect to the ranks not yet connected and
        tell them the cell's file name."""
        self.control, self.run_id = control, run_id
        control.store.set(keys.CELL_FILE, self._cell_file())
        for info in targets:
            client = self.clients.get(info.rank)
            if client is not None and not client.closed:
                continue
            try:
                self.clients[info.rank] = links.connect(
                    info, cluster.view(info.engine_id), control, self.breakpoints,
                    partial(self._on_event, info.rank),
                )  # fmt: skip
            except (DapError, OSError) as exc:  # the cell runs; this rank just does not stop
                self.clients.pop(info.rank, None)
                print(f"distnb: JupyterLab's debugger cannot reach rank {info.rank}: {exc}",
                      file=sys.stderr)  # fmt: skip

    def _on_event(self, rank: int, event: Message) -> None:
        name = event.get("event")
        body = dict(event.get("body") or {})
        if name == "stopped" and "threadId" in body:
            self._mark_stopped(rank, body)
            self._show_stopped(rank, body)
        elif name == "continued" and "threadId" in body:
            self._mark_running(rank)
            self._emit("continued", {"threadId": encode(rank, body["threadId"])})
            if self.resumed_by.pop(rank, "") == "continue":
                self._show_next()
        elif name in ("distnb.closed", "terminated", "exited"):  # the rank or its adapter went
            client = self.clients.pop(rank, None)
            if client is not None:
                client.close()
            was = self.stopped.get(rank)
            self._mark_running(rank, beacon=False)
            if was is not None:
                self._emit("continued", {"threadId": encode(rank, was["threadId"])})
                self._show_next()

    def _rank_shown(self) -> bool:
        """Whether the frontend shows a stopped rank, and no thread of the kernel's own is
        stopped (a cell of the kernel's)."""
        kernel_stopped = bool(getattr(self.debugger, "stopped_threads", ()))
        return self.shown is not None and not kernel_stopped

    def _show_stopped(self, rank: int, body: Message) -> None:
        self.shown = encode(rank, body["threadId"])
        shown = {**body, "threadId": self.shown, "allThreadsStopped": False}
        shown["description"] = f"rank {rank}: {body.get('description') or body.get('reason')}"
        self._emit("stopped", shown)

    def _show_next(self) -> None:
        """Show the frontend a rank still stopped (it shows one thread at a time)."""
        with self._lock:
            still = sorted(self.stopped.items())
        if still:
            self._show_stopped(*still[0])

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
            if self.shown is not None and decode(self.shown)[0] == rank:
                self.shown = None
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

    def _remember_cell(self, info: Any) -> None:
        self.raw_cell = getattr(info, "raw_cell", "") or ""

    def _cell_file(self) -> str:
        """The file the frontend's debugger knows the running `%%allranks` cell by."""
        if not self.raw_cell.lstrip().startswith("%%allranks"):
            return ""
        from ipykernel.compiler import get_file_name

        return str(get_file_name(self.raw_cell))  # type: ignore[no-untyped-call]

    def close(self) -> None:
        """Let stopped ranks go on and end every connection to the ranks."""
        for rank in sorted(self.stopped):
            client = self.clients.get(rank)
            thread = self.stopped[rank].get("threadId", 0)
            self._mark_running(rank)
            if client is not None and not client.closed:
                with contextlib.suppress(DapError):
                    client.request("continue", {"threadId": thread}, timeout=5)
        for client in list(self.clients.values()):
            if not client.closed:  # a proper goodbye: the rank's adapter takes the next client
                with contextlib.suppress(DapError):
                    client.request("disconnect", {"terminateDebuggee": False}, timeout=5)
            client.close()
        self.clients.clear()


async def _off_loop(fn: Any, *args: Any) -> Any:
    """Run a blocking exchange with the ranks off the kernel's control loop."""
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
