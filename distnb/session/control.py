"""The control plane: a TCPStore hosted by the kernel, which every rank joins.

Its server runs on a native thread, so it answers the ranks while the kernel's Python is busy,
and the kernel can read any rank's keys at any time, even while that rank is blocked. That is
how the kernel numbers cells on the ranks, fetches live stacks for hang reports and releases
ranks waiting at a collective that a peer will never reach.
"""

from __future__ import annotations

import secrets
import time
from datetime import timedelta
from typing import Any

from distnb import keys
from distnb.records.beacon import Beacon
from distnb.records.debug import InputRequest


class ControlPlane:
    """The kernel's end of the control plane."""

    def __init__(self, host: str) -> None:
        import torch.distributed as dist

        self.host = host
        self.session_id = f"distnb-{secrets.token_hex(4)}"
        self._server: Any = dist.TCPStore(
            host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
        )
        self.port: int = self._server.port
        # Off loopback, anyone on the network can reach the store: sign it (distnb.rank.signed).
        self.secret = "" if is_loopback(host) else secrets.token_hex(32)
        self.store: Any = self._signed(self._server)
        self._stack_requests: dict[int, int] = {}
        self._asked: list[int] = []  # per rank, the requests for input read so far
        self.begin_run(0, 0, True)  # ranks read it before every cell: it must always be there
        self.store.set(keys.CELL_FILE, "")  # so is the file name a cell runs under (none yet)

    def client(self) -> Any:
        """A connection of its own to the store (signed as `store` is), for a thread that
        waits on it: a waiting client holds its connection."""
        import torch.distributed as dist

        timeout = timedelta(seconds=30)
        return self._signed(dist.TCPStore(self.host, self.port, is_master=False, timeout=timeout))

    def _signed(self, connection: Any) -> Any:
        """The session's view of a connection to the store: its prefix, signed if need be."""
        import torch.distributed as dist

        store = dist.PrefixStore(self.session_id, connection)
        if not self.secret:
            return store
        from distnb.rank.signed import SignedStore

        return SignedStore(store, bytes.fromhex(self.secret))

    def begin_run(
        self, cell: int, run_id: int, check: bool, stdin: bool = True, everyone: bool = True
    ) -> None:
        """Tell the ranks what their next cell is: its number, run id, whether it is checked,
        whether the user can be asked for input and whether every rank runs it."""
        self.store.set(keys.RUN, keys.encode_run(cell, run_id, check, stdin, everyone))

    def expect_ranks(self, n: int) -> None:
        """Before the ranks start: each one's count of requests for input is 0."""
        self._asked = [0] * n
        for rank in range(n):
            self.store.set(keys.ask_count(rank), "0")

    def asks(self) -> list[InputRequest]:
        """Ranks' requests for a line from the user posted since the last call (one read of
        every rank's count when there are none). A count that does not read as a number (not
        the session's: distnb.rank.signed) is passed over."""
        names = [keys.ask_count(rank) for rank in range(len(self._asked))]
        found = []
        for rank, raw in enumerate(self.store.multi_get(names) if names else []):
            count = int(raw) if raw.isdigit() else self._asked[rank]
            while self._asked[rank] < count:
                self._asked[rank] += 1
                key = keys.ask(keys.ask_number(rank, self._asked[rank]))
                found.append(InputRequest.from_json(self.store.get(key)))
                self.store.delete_key(key)
        return found

    def answer(self, n: int, line: str) -> None:
        """Answer request `n` with the line the user typed (or `QUIT`, `SKIP`)."""
        self.store.set(keys.answer(n), line)

    def abort(self, run_id: int, reason: str) -> None:
        """Release every rank waiting at a checked collective in run `run_id`, with `reason`."""
        self.store.set(keys.abort(run_id), reason)

    def stacks(self, ranks: list[int], timeout: float = 1.0) -> dict[int, str]:
        """Each rank's live main-thread stack, from its stack server thread.

        A rank whose stack server does not answer in `timeout` (its process is frozen, or holds the
        GIL inside native code) is left out.
        """
        pending: dict[int, str] = {}
        for rank in ranks:
            n = self._stack_requests.get(rank, 0)
            self._stack_requests[rank] = n + 1
            self.store.set(keys.stack_request(rank, n), "1")
            pending[rank] = keys.stack_reply(rank, n)
        found: dict[int, str] = {}
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for rank, key in list(pending.items()):
                if self.store.check([key]):
                    found[rank] = self.store.get(key).decode()
                    del pending[rank]
            if pending:
                time.sleep(0.005)
        return found

    def beacons(self, ranks: list[int]) -> list[Beacon]:
        """What the listed ranks last said about a long wait at a checked collective."""
        names = [keys.beacon(r) for r in ranks]
        present = [n for n in names if self.store.check([n])]
        values = self.store.multi_get(present) if present else []
        return [Beacon.from_json(v) for v in values if v]  # b"": not signed by the session

    def close(self) -> None:
        # The TCPStore server stops when its last reference goes.
        self.store = None
        self._server = None


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def boards_pattern(session_id: str) -> str:
    """The files of a session's shared-memory boards (/dev/shm/distnb-...), which the reaper
    removes if the kernel dies while a board has not been unlinked yet."""
    from distnb.rank.checked.exchange import shm_path

    return shm_path(session_id, "") + "*"
