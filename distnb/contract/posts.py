"""What this rank posted that others may still read, posted again when a reader asks.

Off loopback anyone who reaches the control plane's port can overwrite any key
(`distnb.contract.signed`). A peer, or the kernel, that waits for a key this rank wrote once (its
host identity, a fingerprint slot, its beacon, a request for input, a stack) would then read a
forged
value for ever. So this rank keeps the last value of each such key, before it posts it
(`post`), and a thread of its own (`Reposter`) posts a key again when a reader asks
(`keys.repost(rank)`, whose value names the key): a thread, because the rank's main thread may
be inside a collective or a long cell when the reader asks. It posts again only over a forged
value or none, in one step on the server (`SignedStore.restore`): a request served late must
not put an older copy over the newer value this rank posted meanwhile (its readers, finding a
valid value of an older stamp, would wait for ever without asking again).

A reader that finds forged values (`SignedStore.take_forged`) calls `ask_again`, which asks
each key's writer (`keys.owner`, or the ring's rank on a board registered with `board_owners`)
at once and then at most every `ASK_EVERY_S` while the value stays forged, and says so on stderr
(the cell's output, on a rank): a wait on a forged value is never a silent one.

Keeping costs a dict store per post, and only off loopback (where the store is signed).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import Any

from distnb.contract import keys
from distnb.contract.signed import ForgedValueError, forged_message

__all__ = [
    "ASK_EVERY_S",
    "Reposter",
    "ask_again",
    "board_owners",
    "drop",
    "post",
    "writer_of",
]

ASK_EVERY_S = 0.5  # a reader asks again this often while a value stays forged
_TELL_EVERY_S = 30.0  # a reader says so once per key in this long
_FOREVER = timedelta(days=365)  # a store's wait without a timeout (it takes none)

_kept: dict[str, bytes | str] = {}  # key -> the value this rank posted last
_owners: dict[str, Sequence[int] | None] = {}  # a board's prefix -> its rings' ranks
_asked: dict[str, float] = {}  # key -> when its writer was last asked
_told: dict[str, float] = {}  # key -> when a reader last said it was forged
_me = ["this rank"]  # who reads, in messages: "rank 3" once a `Reposter` runs here


def post(store: Any, key: str, value: bytes | str) -> None:
    """Post `value` under `key` in `store`, kept first: a reader's request that comes between
    the two is served with this value, not the one before it."""
    _kept[key] = value
    store.set(key, value)


def drop(key: str) -> None:
    """`key` was read (or taken back): nobody will ask for it again."""
    _kept.pop(key, None)


def board_owners(prefix: str, owners: Sequence[int] | None) -> None:
    """The slots under `prefix` (`<prefix>/<ring>/<slot>`) are written by `owners[ring]`
    (None: ring r by rank r)."""
    _owners[prefix] = owners


def writer_of(key: str) -> int | None:
    """The rank that writes `key`, from its name or its board's rings."""
    found = keys.owner(key)
    if found is not None:
        return found
    prefix, _, ring = key.rpartition("/")[0].rpartition("/")
    if prefix not in _owners or not ring.isdigit():
        return None
    owners = _owners[prefix]
    return int(ring) if owners is None else owners[int(ring)]


def ask_again(store: Any, forged: Iterable[str], reader: str = "", gone: bool = False) -> list[str]:
    """Ask the writer of each key in `forged` to post it again (see the module); `reader`
    ("the kernel"; this rank by default) says who read it, in the message; `gone`: the keys
    were deleted rather than overwritten. Returns the keys asked for now."""
    reader = reader or _me[0]
    now = time.monotonic()
    asked = []
    for key in forged:
        owner = writer_of(key)
        if owner is None or now - _asked.get(key, -ASK_EVERY_S) < ASK_EVERY_S:
            continue
        _asked[key] = now
        asked.append(key)
        with contextlib.suppress(RuntimeError):  # a control plane gone: nobody waits any more
            store.set(keys.repost(owner), key)
        if now - _told.get(key, -_TELL_EVERY_S) >= _TELL_EVERY_S:
            _told[key] = now
            what = gone_message(key) if gone else f"{forged_message(key)}; nothing was read from it"
            print(
                f"distnb: {reader}: {what}, and rank {owner} was asked to post it again",
                file=sys.stderr,
                flush=True,
            )
    return asked


def gone_message(key: str) -> str:
    return (
        f"the control plane's value for {keys.role(key)} ({key!r}) is gone (deleted by "
        "something that reached the store?)"
    )


class Reposter:
    """The thread that posts this rank's kept keys again when a reader asks (see the module).

    It has a store connection of its own (a waiting client holds its connection) and blocks in
    `wait` until a request comes, so an undisturbed rank costs nothing.
    """

    STOP = "stop"

    def __init__(self, rank: int, connect: Callable[[], Any]) -> None:
        self._rank = rank
        self._connect = connect
        _me[0] = f"rank {rank}"
        self._thread = threading.Thread(target=self._serve, name="distnb-reposter", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, store: Any) -> None:
        with contextlib.suppress(RuntimeError):
            store.set(keys.repost(self._rank), self.STOP)
        self._thread.join(timeout=1.0)

    def _serve(self) -> None:
        with contextlib.suppress(RuntimeError):  # the control plane went away
            store = self._connect()
            request = keys.repost(self._rank)
            while self._serve_one(store, request):
                pass

    def _serve_one(self, store: Any, request: str) -> bool:
        try:
            store.wait([request], _FOREVER)
            wanted = store.get(request).decode(errors="replace")
        except ForgedValueError:  # a stranger's request: nothing to do but clear it
            store.delete_key(request)
            time.sleep(0.01)
            return True
        store.delete_key(request)
        if wanted == self.STOP:
            return False
        value = _kept.get(wanted)
        if value is not None:
            store.restore(wanted, value)  # not over a valid (newer) value: see the module
        return True
