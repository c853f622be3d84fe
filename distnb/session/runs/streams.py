"""A rank's output in the order it was written: every stream message of a request, as it arrives.

ipyparallel keeps what an engine prints as two texts, stdout and stderr, so a cell that wrote
`a` to stdout, `b` to stderr and `c` to stdout came back as `a c` and `b`. The engine sends its
streams in the order written (`distnb.rank.engine.EngineStream`); `execute` sends a cell with a
`StreamLog` attached to the request's future before the request leaves, so the log sees every
stream message of the request, from the first, in the order the kernel received them. The log
also wakes the run's wait loop, which shows new lines at once.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from distnb.views.lines import Write

__all__ = ["StreamLog", "execute"]


class StreamLog:
    """One request's stream messages, as `Write`s in arrival order (appended on ipyparallel's
    I/O thread, read by the kernel's main thread)."""

    def __init__(self, wake: threading.Event) -> None:
        self.writes: list[Write] = []
        self.chars = {"stdout": 0, "stderr": 0}
        self._wake = wake

    def written(self) -> tuple[int, int]:
        """How many characters of stdout and stderr arrived."""
        return self.chars["stdout"], self.chars["stderr"]

    def receive(self, msg: dict[str, Any]) -> None:
        """ipyparallel's iopub callback: every message of the request passes here."""
        if msg["header"]["msg_type"] != "stream":
            return
        content = msg["content"]
        name, text = content["name"], content["text"]
        self.writes.append(Write(name, text, time.monotonic()))
        self.chars[name] = self.chars.get(name, 0) + len(text)
        self._wake.set()


def execute(view: Any, code: str, log: StreamLog) -> Any:
    """`view.execute(code, silent=False, block=False)` for a view of one engine, with `log` fed
    every stream message of the request.

    `DirectView.execute` offers no way to attach a callback before the request is sent, and one
    attached after it may miss the first messages; `Client.send_execute_request` does
    (`message_future_hook`), so this is `DirectView.execute` with the hook.
    """
    from ipyparallel.client.asyncresult import AsyncResult

    client = view.client
    idents, targets = client._build_targets(view.targets)
    future = client.send_execute_request(
        view._socket,
        code,
        silent=False,
        ident=idents[0],
        metadata={"label": None},
        message_future_hook=lambda f: f.iopub_callbacks.append(log.receive),
    )
    return AsyncResult(client, future, fname="execute", targets=targets, owner=True)
