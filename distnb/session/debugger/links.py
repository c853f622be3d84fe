"""The kernel's connection to one rank's debug adapter, made ready for JupyterLab's debugger.

debugpy listens on the rank's loopback (it has no authentication): a rank on this machine is
reached directly, a rank on another host through the signed control plane
(`distnb.contract.relay`). The connection is initialized and attached as a frontend would,
with the breakpoints the frontend has set.
"""

from __future__ import annotations

import secrets
import socket
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from distnb.records.cell import RankInfo
from distnb.session.control import ControlPlane
from distnb.session.debugger.dap import DapClient, DapError, Message
from distnb.session.debugger.ids import encode

__all__ = ["connect", "ready", "set_breakpoints", "threads"]

READY_S = 60.0  # a rank's first start of its adapter imports pydevd: seconds on a busy machine


def connect(
    info: RankInfo,
    view: Any,
    control: ControlPlane,
    breakpoints: Mapping[str, Sequence[Message]],
    on_event: Callable[[Message], None],
) -> DapClient:
    """A connection to `info`'s adapter (started on the rank through its ipyparallel `view`),
    attached, with `breakpoints` (source path -> the frontend's) set; its events go to
    `on_event`."""
    from distnb.rank.debug.visual import listen

    host, port, not_mine = view.apply_sync(listen)
    sock = _socket(info, view, control, host, port)
    return ready(sock, f"rank {info.rank}", not_mine, breakpoints, on_event)


def ready(
    sock: socket.socket,
    name: str,
    not_mine: Sequence[str],
    breakpoints: Mapping[str, Sequence[Message]],
    on_event: Callable[[Message], None],
) -> DapClient:
    """A client on `sock` (connected to a rank's adapter), initialized and attached as a
    frontend would, stepping past the folders `not_mine`, with `breakpoints` set."""
    initialized = threading.Event()

    def event(message: Message) -> None:
        if message.get("event") == "initialized":
            initialized.set()
        else:
            on_event(message)

    client = DapClient(sock, event, name=name)
    client.request(
        "initialize",
        {
            "clientID": "distnb",
            "adapterID": "python",
            "pathFormat": "path",
            "linesStartAt1": True,
            "columnsStartAt1": True,
            "supportsVariableType": True,
        },
    )
    rules = [{"path": folder, "include": False} for folder in not_mine]
    client.send_request("attach", {"justMyCode": True, "rules": rules, "subProcess": False})
    if not initialized.wait(READY_S):
        client.close()
        raise DapError(f"{name}'s debugger did not get ready within {READY_S:g} s")
    for path, set_here in breakpoints.items():
        client.request("setBreakpoints", {"source": {"path": path}, "breakpoints": list(set_here)})
    client.request("configurationDone")
    return client


def _socket(
    info: RankInfo, view: Any, control: ControlPlane, host: str, port: int
) -> socket.socket:
    """Straight to the adapter on this machine; on another host, relayed."""
    if info.here:
        return socket.create_connection((host, port), timeout=10)
    from distnb.contract.relay import Relay
    from distnb.rank.runtime import connect_adapter

    channel = f"{info.rank}-{secrets.token_hex(4)}"
    ours, theirs = socket.socketpair()
    Relay(theirs, channel, "rank", (control.client(), control.client()))
    view.apply_sync(connect_adapter, channel)
    return ours


def threads(clients: Mapping[int, DapClient]) -> list[Message]:
    """Every rank's threads as the frontend lists them: `rank r` (the main thread) or
    `rank r: name`, without distnb's and debugpy's own threads."""
    found = []
    for rank, client in sorted(clients.items()):
        try:
            listed = client.request("threads").get("threads", [])
        except DapError:
            continue
        for thread in listed:
            own = thread["name"]
            if own.startswith(("distnb", "Thread-", "pydevd", "IPythonHistory")):
                continue
            name = f"rank {rank}" if own == "MainThread" else f"rank {rank}: {own}"
            found.append({"id": encode(rank, thread["id"]), "name": name})
    return found


def set_breakpoints(
    clients: Mapping[int, DapClient], path: str, breakpoints: Sequence[Message]
) -> None:
    """The frontend's breakpoints of `path`, on every connected rank; a rank that does not
    confirm them is named on stderr (it may run past them), not passed over in silence."""
    for rank, client in clients.items():
        try:
            client.request(
                "setBreakpoints", {"source": {"path": path}, "breakpoints": list(breakpoints)}
            )
        except DapError as exc:  # a rank that went is dropped as its link ends
            if not client.closed:
                print(
                    f"distnb: rank {rank} did not take the breakpoints of {path}: {exc}; it "
                    "may run past them",
                    file=sys.stderr,
                )
