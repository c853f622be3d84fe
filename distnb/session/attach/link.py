"""The notebook's connection to an attached job: its control plane, and requests to its ranks.

`Link.ask` posts one request (`distnb.records.agent.AgentRequest`) to each rank's agent at once
(numbered with the rank's counter, `keys.agent_calls`) and collects the replies (`Reply`) as
they come, so a status of 16 ranks costs one round of requests, not 16 in turn. A rank that
does not answer in time is left out: the caller says what that means. `Link.lease` counts the
job's lease up every second from a thread of its own while the notebook is attached
(`distnb.rank.agent.stopped`): when the kernel dies, the count stops, and stopped or held ranks
go on by themselves.

The control plane is the job's torch `TCPStore`, reached here through distnb's torch-free client
(`distnb.contract.storewire`), signed as the ranks sign it (`distnb.contract.signing`): the
kernel does not import torch to attach.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Mapping

from distnb import interrupts
from distnb.contract import keys
from distnb.contract.folders import Endpoint
from distnb.contract.signing import Signed
from distnb.contract.storewire import WireStore
from distnb.errors import SessionError
from distnb.records.agent import AgentInfo, AgentRequest, Reply, dumps_request, loads_reply

__all__ = ["Link"]

_POLL_S = 0.002
LEASE_EVERY_S = 1.0


class Link:
    """See the module. `secret` is the run's (hex), from its run folder."""

    def __init__(self, endpoint: Endpoint, secret: str, connect_timeout_s: float = 10.0) -> None:
        self.endpoint = endpoint
        self._secret = bytes.fromhex(secret)
        self._timeout_s = connect_timeout_s
        try:
            self.store = self.client()
        except RuntimeError as exc:
            raise SessionError(
                f"cannot reach the job's control plane at {endpoint.host}:{endpoint.port} "
                f"(run {endpoint.run}, launcher pid {endpoint.launcher_pid} on "
                f"{endpoint.hostname}): the job may have ended, or this machine cannot reach "
                f"that address ({exc})"
            ) from None
        self._stop = threading.Event()
        self._lease: threading.Thread | None = None

    def twin(self) -> Link:
        """Another link to the same job: requests from another thread, on a connection of its
        own."""
        return Link(self.endpoint, self._secret.hex())

    def client(self) -> Signed:
        """A connection of its own to the job's control plane (`StoreGone` where there is
        none); its keys are the run's, as the ranks' `PrefixStore(run, ...)` sees them."""
        e = self.endpoint
        return Signed(WireStore(e.host, e.port, e.run, self._timeout_s), self._secret)

    def ask(
        self, ranks: Iterable[int], request: AgentRequest, timeout_s: float = 2.0
    ) -> dict[int, Reply]:
        """Each rank's reply (a value, or the error it raised); ranks silent for `timeout_s`
        are left out."""
        return self.ask_each(dict.fromkeys(ranks, request), timeout_s)

    def ask_each(
        self, requests: Mapping[int, AgentRequest], timeout_s: float = 2.0
    ) -> dict[int, Reply]:
        """`ask`, a request of its own to each rank."""
        bodies: dict[AgentRequest, str] = {}
        ranks = list(requests)
        # a number taken is a request posted: a rank's agent reads its requests in turn, and
        # would wait for good on a number whose request Ctrl-C kept from coming. Every rank's
        # number, request, presence check and deletion goes in one write (`WireStore.add_each`)
        with interrupts.held() as noted:
            numbers = self.store.add_each([keys.agent_calls(r) for r in ranks], 1)
            posts = []
            for rank, n in zip(ranks, numbers, strict=True):
                request = requests[rank]
                body = bodies.get(request) or bodies.setdefault(request, dumps_request(request))
                posts.append((keys.agent_request(rank, n - 1), body))
            self.store.set_each(posts)
        noted.check()
        pending = {r: keys.agent_reply(r, n - 1) for r, n in zip(ranks, numbers, strict=True)}
        replies: dict[int, Reply] = {}
        deadline = time.monotonic() + timeout_s
        while pending:
            # the replies there, each read once: one read for all of them
            there = self.store.present_each(list(pending.values()))
            ready = [rank for rank, yes in zip(pending, there, strict=True) if yes]
            keys_ = [pending.pop(rank) for rank in ready]
            if keys_:
                for rank, key, raw in zip(ready, keys_, self.store.multi_get(keys_), strict=True):
                    replies[rank] = loads_reply(raw or self.store.get(key))  # forged: `get` says
                self.store.delete_each(keys_)
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(_POLL_S)
        return replies

    def registered(self, rank: int) -> AgentInfo | None:
        """What rank `rank`'s agent said at its start (host, pid, local rank, world size)."""
        key = keys.agent_rank(rank)
        if not self.store.check([key]):
            return None
        raw = self.store.multi_get([key])[0]
        return AgentInfo.from_dict(json.loads(raw)) if raw else None

    def start_lease(self) -> None:
        if self._lease is None:
            self._lease = threading.Thread(target=self._renew, name="distnb-lease", daemon=True)
            self._lease.start()

    def _renew(self) -> None:
        store, n = self.client(), 0
        while not self._stop.is_set():
            n += 1
            try:
                store.set(keys.AGENT_LEASE, str(n))
            except RuntimeError:  # the job has ended
                break
            self._stop.wait(LEASE_EVERY_S)
        store.close()

    def close(self) -> None:
        self._stop.set()
        if self._lease is not None:
            self._lease.join(timeout=2 * LEASE_EVERY_S)
        self.store.close()  # what is asked of it after raises `StoreGone`
