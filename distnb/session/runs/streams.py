"""A rank's output in the order it was written: every stream message of a request, as it arrives.

ipyparallel keeps what an engine prints as two texts, stdout and stderr, so a cell that wrote
`a` to stdout, `b` to stderr and `c` to stdout came back as `a c` and `b`. The engine sends its
streams in the order written (`distnb.rank.engine.EngineStream`); `execute` sends a cell with a
`StreamLog` attached to the request's future before the request leaves, so the log sees every
stream message of the request, from the first, in the order the kernel received them. The log
also wakes the run's wait loop, which shows new lines at once.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from distnb.views.lines import Write

__all__ = ["Reply", "StreamLog", "Tally", "execute", "wait_for_outputs"]


class Tally:
    """How many writes a run's logs received, all ranks together (counted on ipyparallel's I/O
    thread, the only writer): the run learns that output arrived without looking at each log."""

    def __init__(self) -> None:
        self.count = 0


class StreamLog:
    """One request's stream messages, as `Write`s in arrival order (appended on ipyparallel's
    I/O thread, read by the kernel's main thread)."""

    def __init__(self, wake: threading.Event, tally: Tally | None = None) -> None:
        self.writes: list[Write] = []
        self.chars = {"stdout": 0, "stderr": 0}
        self._wake = wake
        self._tally = tally or Tally()

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
        self._tally.count += 1
        self._wake.set()


def execute(views: Mapping[int, Any], code: str, logs: Mapping[int, StreamLog]) -> dict[int, Reply]:
    """`view.execute(code, silent=False, block=False)` on each rank's view of one engine, with
    the rank's log fed every stream message of its request: each rank's `Reply`.

    `DirectView.execute` offers no way to attach a callback before the request is sent, and one
    attached after it may miss the first messages; so this does what `Client.send_execute_request`
    does for each engine, with the log attached to the request's future before it leaves. What
    ipyparallel does per request and need not, it does once a cell: the engines' identities are
    found at once, the requests go to ipyparallel's I/O thread in one hand-off (one wake of its
    loop, not one per rank), and one callback, once every reply and output arrived, drops the
    requests from the client's caches (ipyparallel makes one per request, and `%px` one
    `AsyncResult` of three combined futures more) and sets the event `wait_for_outputs` waits on.
    """
    from ipyparallel.client.futures import multi_future

    if not views:
        return {}
    first = next(iter(views.values()))
    client, socket = first.client, first._socket  # every view of a client shares its socket
    if client._closed:
        raise OSError("Connections have been closed.")
    idents, _ = client._build_targets([view.targets for view in views.values()])
    engines = set(client._engines.values())
    content = {"code": code, "silent": False, "user_expressions": {}}
    futures, sends = {}, []
    for (rank, log), ident in zip(logs.items(), idents, strict=True):
        msg = client.session.msg("execute_request", content=content, metadata={"label": None})
        msg_id = msg["header"]["msg_id"]
        client.outstanding.add(msg_id)
        client.history.append(msg_id)
        if (engine := ident.decode()) in engines:  # its death resolves the request
            client._outstanding_dict[engine].add(msg_id)
        future = client.create_message_futures(msg_id, msg["header"], async_result=True)[0]
        future.iopub_callbacks.append(log.receive)
        futures[rank] = future
        sends.append((msg, ident))

    def send() -> None:  # on the I/O thread, as ipyparallel sends
        for msg, ident in sends:
            client.session.send(socket, msg, ident=ident)

    arrived = threading.Event()

    def forget(_f: Any) -> None:
        for msg_id in (future.msg_id for future in futures.values()):
            for cache in (client._futures, client._output_futures, client.results, client.metadata):
                cache.pop(msg_id, None)
        arrived.set()

    multi_future([f for r in futures.values() for f in (r, r.output)]).add_done_callback(forget)
    client._io_loop.add_callback(send)
    return {rank: Reply(future, arrived) for rank, future in futures.items()}


class Reply:
    """One rank's request of a cell, as its single-engine `AsyncResult` would show it."""

    def __init__(self, future: Any, arrived: threading.Event | None = None) -> None:
        self._future = future  # ipyparallel's MessageFuture: the reply, and `.output`
        # set once every request of the cell has its reply and output (`execute`)
        self.arrived = arrived
        self.msg_ids = [future.msg_id]
        self.metadata = future.output.metadata  # grows as the engine's iopub messages arrive

    def done(self) -> bool:
        return bool(self._future.done())

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        self._future.add_done_callback(fn)

    def get(self, timeout: float | None = None) -> Any:
        """The reply; the rank's error is raised (a `RemoteError`, ipyparallel's `EngineError`)."""
        try:
            result = self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError("Result not ready.") from None
        if isinstance(result, Exception):
            raise result
        return result

    def wait_for_output(self, timeout: float | None = None) -> bool:
        """Whether the reply and every output message arrived, waiting up to `timeout` s."""
        both = (self._future, self._future.output)
        return not concurrent.futures.wait(both, timeout).not_done


def wait_for_outputs(replies: Iterable[Reply], timeout: float | None = None) -> bool:
    """Whether every reply and all their output messages arrived, waiting up to `timeout` s in
    all: one event for one cell's requests, however many ranks."""
    replies = list(replies)
    cell = {id(r.arrived): r.arrived for r in replies}
    if len(cell) == 1 and (arrived := next(iter(cell.values()))) is not None:
        return arrived.wait(timeout)
    futures = [f for r in replies for f in (r._future, r._future.output)]
    return not concurrent.futures.wait(futures, timeout).not_done
