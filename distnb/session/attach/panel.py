"""JupyterLab's debugger panel on an attached job's stopped ranks (`AttachedJob.panel`).

The relay that shows distnb's own ranks in the panel (`distnb.session.debugger.visual`) shows
an attached job's ranks the same way: each as a thread `rank N`, its frames `[rank N] name`,
scopes, variables (tensors as dtype, shape, device and a preview), and `next`, `stepIn`,
`stepOut`, `continue` relayed to that rank. What differs is how a rank gets there:

- a rank stopped at its debugger prompt (`job.stop()`, or a breakpoint set from the notebook)
  is asked to start debugpy (a `Call` of `Listen`, `distnb.rank.agent.panel`: only now, so an agent
  never asked never imports it), on its loopback, as distnb's own ranks do: debugpy has no
  authentication. The kernel connects to it (`links.ready`): directly on this machine, through
  the job's signed control plane from another host (`distnb.contract.relay`, the rank's end
  on the agent's store connections), sets the breakpoints the notebook
  set on that rank (`job.breakpoint`), now debugpy's, and hands the rank over (`Panel`): pdb
  lets go and the rank suspends in debugpy at the line it stopped at;
- peers wait safely: when a rank stops in the panel, every rank of the job not stopped is held
  before its next collective (the agent's `Hold`: it waits outside gloo or NCCL, where
  timeouts run); once no rank is stopped for `RELEASE_S` (a rank continued, or stepping over a
  collective that needs its peers), they are released;
- `close` (at `detach`): the stopped ranks are continued, the connections end, and the agents
  stop debugpy's tracing at their next safe point: the job runs on as it would have.

Not built: one panel for a session's own ranks and an attached job's together (threads are
told apart by rank number).
"""

from __future__ import annotations

import secrets
import socket
import threading
from functools import partial
from typing import TYPE_CHECKING, Any

from distnb.errors import ConfigError
from distnb.records.agent import Hold, Listen, Listening, Panel, RelayTo, Release, answer_line
from distnb.session.attach import inside
from distnb.session.debugger import links, visual
from distnb.session.debugger.dap import DapError

if TYPE_CHECKING:
    from distnb.session.attach.surface import JobSurface
    from distnb.session.debugger.visual import VisualDebugger

__all__ = ["RELEASE_S", "JobPanel", "relay"]

RELEASE_S = 1.0
Message = dict[str, Any]


def relay() -> VisualDebugger:
    """The kernel's relay for JupyterLab's debugger, attached; ConfigError saying how if not."""
    found = visual.active()
    if found is None:
        raise ConfigError(
            "JupyterLab's debugger is off: switch it on (the bug icon of the notebook's "
            "toolbar) and call job.panel() again; in a terminal, use the text debugger: "
            "job.debug() or %dist_attach --debug"
        )
    return found


class JobPanel:
    """The panel's connections to an attached job's ranks (see the module)."""

    def __init__(self, job: JobSurface, to: VisualDebugger) -> None:
        self.job = job
        self.relay = to
        self.link = job.link.twin()  # holds and releases, asked from the adapters' threads
        self.ranks: set[int] = set()  # connected
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._closed = False

    def connected(self, rank: int) -> bool:
        client = self.relay.clients.get(rank)
        return rank in self.ranks and client is not None and not client.closed

    def show(self, breaks: dict[int, dict[str, list[Message]]], wait_s: float) -> list[int]:
        """Hand every stopped rank to the panel; the ranks handed."""
        foreign = sorted(set(self.relay.clients) - self.ranks)
        if foreign:
            raise ConfigError(
                f"JupyterLab's panel already shows rank {foreign[0]} of this kernel's distnb "
                "session: switch the debugger off and on (the bug icon), or stop the session, "
                "then job.panel() again"
            )
        asked = inside.stopped(self.job, None, wait_s)
        new = [r for r in asked if not self.connected(r)]
        if new:
            found = inside.call(self.job, Listen(), new)
            for rank in new:
                self._connect(rank, Listening.from_dict(found[rank]), breaks.get(rank, {}))
        self.relay.panel.listen()
        for request in inside.stopped(self.job, list(asked), wait_s).values():
            self.job.prompts.answer(request.n, answer_line(Panel()))
        return sorted(asked)

    def _connect(self, rank: int, where: Listening, breaks: dict[str, list[Message]]) -> None:
        try:
            client = links.ready(
                self._socket(rank, where),
                f"rank {rank}",
                where.folders,
                breaks,
                partial(self._event, rank),
            )
        except (DapError, OSError) as exc:
            raise ConfigError(f"JupyterLab's debugger cannot reach rank {rank}: {exc}") from None
        self.relay.clients[rank] = client
        self.ranks.add(rank)

    def _socket(self, rank: int, where: Listening) -> socket.socket:
        """Straight to the rank's adapter on this machine; on another host, relayed over the
        job's signed control plane (debugpy listens on the rank's loopback only)."""
        if _here(self.job, rank):
            return socket.create_connection((where.host, where.port), timeout=10)
        from distnb.contract.relay import Relay  # the rank's package: loaded only here

        channel = f"{rank}-{secrets.token_hex(4)}"
        ours, theirs = socket.socketpair()
        link = self.job.link
        Relay(theirs, channel, "rank", (link.client(), link.client()))
        inside.call(self.job, RelayTo(channel), [rank])
        return ours

    def set_breaks(self, rank: int, path: str, breaks: list[Message]) -> None:
        """`path`'s breakpoints on a rank the panel shows (debugpy's, no longer pdb's)."""
        client = self.relay.clients[rank]
        client.request("setBreakpoints", {"source": {"path": path}, "breakpoints": breaks})

    def resume(self, ranks: list[int]) -> None:
        """Continue the ranks of `ranks` stopped in the panel."""
        for rank in ranks:
            stop = self.relay.stopped.get(rank)
            if stop is not None and self.connected(rank):
                self.relay.clients[rank].request("continue", {"threadId": stop["threadId"]})

    def _event(self, rank: int, event: Message) -> None:
        self.relay.on_event(rank, event)
        name = event.get("event")
        if name == "stopped":
            self._later(0.0)
        elif name in ("continued", "distnb.closed", "terminated", "exited"):
            self._later(RELEASE_S)

    def _later(self, delay: float) -> None:
        """Hold or release the peers after `delay` (off the adapter's reading thread)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            if self._closed:
                return
            self._timer = threading.Timer(delay, self._peers)
            self._timer.daemon = True
            self._timer.start()

    def _peers(self) -> None:
        """Ranks not stopped are held while a rank is stopped in the panel; else released."""
        stopped = set(self.relay.stopped) & self.ranks
        with self._lock:
            try:
                if stopped:
                    others = [r for r in self.job.ranks if r not in stopped]
                    self.link.ask(others, Hold())
                else:
                    self.link.ask(self.job.ranks, Release())
            except (RuntimeError, AttributeError):  # detached meanwhile
                pass

    def close(self) -> None:
        """Continue the stopped ranks, end the connections (all of them the job's)."""
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
        self.relay.close()
        self.relay.panel.listen()
        self.ranks.clear()
        self.link.close()


def _here(job: JobSurface, rank: int) -> bool:
    """Whether `rank` runs on this machine (its agent said where at its start)."""
    info = job.link.registered(rank)
    return info is None or info.host == socket.gethostname()
