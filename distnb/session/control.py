"""The control plane: a TCPStore hosted by the kernel, which every rank joins.

Its server runs on a native thread, so it answers the ranks while the kernel's Python is busy,
and the kernel can read any rank's keys at any time, even while that rank is blocked. That is
how the kernel numbers cells on the ranks, fetches live stacks for hang reports and releases
ranks waiting at a collective that a peer will never reach.

Off loopback a stranger can overwrite any key (`distnb.contract.signed`). What the kernel posts for
the ranks to read (the cell's note, aborts, answers to prompts, the visual debugger's file name)
it keeps, and posts again when it finds it forged (`keep`, every `KEEP_EVERY_S` while a run
waits); what it reads from a rank and finds forged (beacons, requests for input, stacks) it asks
that rank to post again (`distnb.contract.posts`). Either way it says so on stderr.
"""

from __future__ import annotations

import secrets
import sys
import time
from datetime import timedelta
from typing import Any

from distnb.contract import keys
from distnb.interrupts import import_whole
from distnb.records.beacon import Beacon, BeaconState
from distnb.records.collective import Mismatch
from distnb.records.debug import InputRequest

KEEP_EVERY_S = 0.25  # how often `keep` looks at the kernel's posts while a run waits
TELL_EVERY_S = 30.0  # how often the kernel says that one key of its own was forged


class ControlPlane:
    """The kernel's end of the control plane."""

    def __init__(self, host: str) -> None:
        dist: Any = import_whole("torch.distributed")  # Ctrl-C must not cut torch's import

        self.host = host
        self.session_id = f"distnb-{secrets.token_hex(4)}"
        self._server: Any = dist.TCPStore(
            host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
        )
        self.port: int = self._server.port
        # Off loopback, anyone on the network can reach the store: sign it (distnb.contract.signed).
        self.secret = "" if is_loopback(host) else secrets.token_hex(32)
        self.store: Any = self._signed(self._server)
        self._stack_requests: dict[int, int] = {}
        self._beacons: dict[str, tuple[bytes, Beacon]] = {}  # key -> last read, as decoded
        self._asked: list[int] = []  # per rank, the requests for input read so far
        self._kept: dict[str, str] = {}  # the kernel's posts that ranks may still read
        self._answers: set[str] = set()  # kept until their rank deletes them (it read them)
        self._kept_at = 0.0
        self._told: dict[str, float] = {}  # key -> when a forgery of it was last said
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
        from distnb.contract.signed import SignedStore

        return SignedStore(store, bytes.fromhex(self.secret))

    def begin_run(
        self, cell: int, run_id: int, check: bool, stdin: bool = True, everyone: bool = True
    ) -> None:
        """Tell the ranks what their next cell is: its number, run id, whether it is checked,
        whether the user can be asked for input and whether every rank runs it."""
        # an earlier run's posts are read no more, but for answers to prompts still open
        self._kept = {k: v for k, v in self._kept.items() if k in self._answers}
        self.post(keys.RUN, keys.encode_run(cell, run_id, check, stdin, everyone))

    def post(self, key: str, value: str) -> None:
        """Post `value` under `key` for the ranks, and keep it valid while they may read it
        (see the module)."""
        self.store.set(key, value)
        if self.secret:
            self._kept[key] = value

    def keep(self) -> None:
        """Post again what a stranger overwrote among the kernel's posts (at most every
        `KEEP_EVERY_S`). An answer no longer there was read: its rank deletes it."""
        now = time.monotonic()
        if not self._kept or now - self._kept_at < KEEP_EVERY_S:
            return
        self._kept_at = now
        for key, value in list(self._kept.items()):
            state = value_state(self.store, key)
            if state == "valid":
                continue
            if state == "absent" and key in self._answers:
                del self._kept[key]
                self._answers.discard(key)
                continue
            self.store.set(key, value)
            if state == "forged" and now - self._told.get(key, -TELL_EVERY_S) >= TELL_EVERY_S:
                self._told[key] = now  # once in a while: a stranger may write for minutes
                _tell(f"{forged_words(key)}; posted it again")

    def expect_ranks(self, n: int) -> None:
        """Before the ranks start: each one's count of requests for input is 0, and its beacon
        says it is in no long wait, so that every rank's beacon is there to read in one round
        trip (`beacons`)."""
        self._asked = [0] * n
        for rank in range(n):
            self.store.set(keys.ask_count(rank), "0")
            self.store.set(keys.beacon(rank), Beacon(rank, BeaconState.RUNNING).to_json())

    def asks(self) -> list[InputRequest]:
        """Ranks' requests for a line from the user posted since the last call (one read of
        every rank's count when there are none). A forged count or request is asked for again
        from its rank, and read at a later call. The run's wait calls this on every wake, so
        it also `keep`s the kernel's posts."""
        self.keep()
        names = [keys.ask_count(rank) for rank in range(len(self._asked))]
        found = []
        for rank, raw in enumerate(self.store.multi_get(names) if names else []):
            count = int(raw) if raw.isdigit() else self._asked[rank]
            while self._asked[rank] < count:
                key = keys.ask(keys.ask_number(rank, self._asked[rank] + 1))
                value = _valid_or_none(self.store, key)
                if value is None:
                    break  # forged (asked again below), or not there yet
                found.append(InputRequest.from_json(value))
                self.store.delete_key(key)
                self._asked[rank] += 1
        ask_for_forged(self.store)
        return found

    def answer(self, n: int, line: str) -> None:
        """Answer request `n` with the line the user typed (or `QUIT`, `SKIP`)."""
        self.post(keys.answer(n), line)
        if self.secret:
            self._answers.add(keys.answer(n))

    def abort(self, run_id: int, reason: str) -> None:
        """Release every rank waiting at a checked collective in run `run_id`, with `reason`."""
        self.post(keys.abort(run_id), reason)

    def mismatch(self, run_id: int) -> Mismatch | None:
        """The mismatch run `run_id`'s ranks raised, as they posted it (`keys.mismatch`); the
        key is taken, so a later run cannot read it."""
        key = keys.mismatch(run_id)
        value = _valid_or_none(self.store, key)
        if value is None:
            return None
        self.store.delete_key(key)
        return Mismatch.from_json(value)

    def stacks(self, ranks: list[int], timeout: float = 1.0) -> dict[int, str]:
        """Each rank's live main-thread stack, from its stack server thread.

        A rank whose stack server does not answer in `timeout` (its process is frozen, or holds the
        GIL inside native code) is left out.
        """
        pending: dict[int, str] = {}
        requested: list[str] = []  # kept while the replies are awaited
        for rank in ranks:
            n = self._stack_requests.get(rank, 0)
            self._stack_requests[rank] = n + 1
            self.store.set(keys.stack_request(rank, n), "1")
            pending[rank] = keys.stack_reply(rank, n)
            if self.secret:
                self._kept[keys.stack_request(rank, n)] = "1"
                requested.append(keys.stack_request(rank, n))
        found: dict[int, str] = {}
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for rank, key in list(pending.items()):
                value = _valid_or_none(self.store, key)
                if value is not None:
                    found[rank] = value.decode()
                    del pending[rank]
            if pending:
                self.keep()  # a forged request is posted again
                ask_for_forged(self.store)  # a forged stack, by its rank
                time.sleep(0.005)
        for key in requested:
            self._kept.pop(key, None)  # answered, or given up on: the next asks anew
        return found

    def beacons(self, ranks: list[int]) -> list[Beacon]:
        """What the listed ranks last said about a long wait at a checked collective."""
        names = [keys.beacon(r) for r in ranks]
        # Every beacon is there from the start (`expect_ranks`): one look at all of them, and
        # one at each only if a stranger deleted one; one read of them all, which verifies
        # each (a forged one reads empty). A read on every wake of a cell's wait must not cost
        # a round trip per rank (at 16 ranks that was a quarter of an empty cell's time), nor a
        # decode per rank: a beacon is decoded when it changed.
        if not _present(self.store, names):
            names = [n for n in names if _present(self.store, [n])]
        values = self.store.multi_get(names) if names else []
        ask_for_forged(self.store)  # a forged beacon: its rank posts it again
        found = []
        for name, raw in zip(names, values, strict=True):
            if raw:
                last = self._beacons.get(name)
                if last is None or last[0] != raw:
                    last = self._beacons[name] = (raw, Beacon.from_json(raw))
                found.append(last[1])
        return found

    def close(self) -> None:
        # The TCPStore server stops when its last reference goes.
        self.store = None
        self._server = None


def _present(store: Any, names: list[str]) -> bool:
    """Whether every key of `names` holds a value: one round trip, reading none (a signed
    store's `check` also reads and verifies them)."""
    return bool(store.present(names) if hasattr(store, "present") else store.check(names))


def ask_for_forged(store: Any) -> None:
    """Ask the ranks that wrote the keys `store` read forged to post them again
    (`distnb.contract.posts`); nothing to do for a store that is not signed."""
    forged = store.take_forged() if hasattr(store, "take_forged") else []
    if forged:
        from distnb.contract.posts import ask_again

        ask_again(store, forged, "the kernel")


def _valid_or_none(store: Any, key: str) -> bytes | None:
    """A rank's value under `key` if it is there and not forged (a forgery is noted by the
    store, for `ask_for_forged`), else None."""
    if not store.check([key]):
        return None
    value: bytes = store.multi_get([key])[0]
    return value or None  # b"": forged since the check


def value_state(store: Any, key: str) -> str:
    """ "valid", "forged" (signed stores only) or "absent"."""
    state = getattr(store, "state", None)
    if state is not None:
        return str(state(key))
    return "valid" if store.check([key]) else "absent"


def forged_words(key: str) -> str:
    from distnb.contract.signed import forged_message

    return forged_message(key)


def _tell(text: str) -> None:
    """A line on the kernel's stderr (the cell's output in a notebook)."""
    print(f"distnb: the kernel: {text}", file=sys.stderr, flush=True)


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def boards_pattern(session_id: str) -> str:
    """The files of a session's shared-memory boards (/dev/shm/distnb-...), which the reaper
    removes if the kernel dies while a board has not been unlinked yet."""
    from distnb.rank.checked.exchange import shm_path

    return shm_path(session_id, "") + "*"
