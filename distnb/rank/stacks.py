"""A rank's live stack, for the kernel: `main_stack()` and the thread that serves it.

The kernel asks for a rank's stack through the control plane (`keys.stack_request`) when a cell
times out or is interrupted (`ControlPlane.stacks`); `StackServer`'s thread answers
(`keys.stack_reply`) even while the rank's main thread is busy or blocked in a collective.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from collections.abc import Callable
from datetime import timedelta

import torch.distributed as dist

from distnb.contract import keys, posts
from distnb.contract.signed import ForgedValueError
from distnb.rank.checked.callsite import user_paths
from distnb.rank.shell import cell_of_file
from distnb.userfiles import is_users

__all__ = ["StackServer", "main_stack"]


def main_stack() -> str:
    """The main thread's Python stack from the cell down, the innermost cell line first; while
    a `%dist_run` script runs, from the script down, its innermost line (or its neighbours')
    first, wherever the script lies."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    if frame is None:
        return "(no main thread)"
    entries = list(traceback.extract_stack(frame))
    script = user_paths()
    if script:
        # the launcher's cell says nothing: the script is the user's code
        tops = [i for i, e in enumerate(entries) if is_users(e.filename, script)]
    else:
        tops = [i for i, e in enumerate(entries) if cell_of_file(e.filename) is not None]
    lines = []
    if tops:
        inner = entries[tops[-1]]
        cell = cell_of_file(inner.filename)
        where = f"cell In[{cell}]" if cell is not None else inner.filename
        lines.append(f"at {where} line {inner.lineno}: {(inner.line or '').strip()}")
        # Frames below the cell (or script) are ipyparallel's, IPython's and distnb's.
        entries = entries[tops[0] :]
    lines.append("Stack (most recent call last):")
    package = os.path.dirname(os.path.dirname(__file__))
    # distnb's own frames (a checked collective waiting for peers) say nothing to the user.
    entries = [e for e in entries if not e.filename.startswith(package)]
    for entry in entries:
        cell = cell_of_file(entry.filename)
        where = f"In[{cell}]" if cell is not None else entry.filename
        lines.append(f'  File "{where}", line {entry.lineno}, in {entry.name}')
        if entry.line:
            lines.append(f"    {entry.line.strip()}")
    return "\n".join(lines)


class StackServer:
    """Answers the kernel's stack requests while the main thread is busy or blocked.

    It has its own store connection (`connect()` makes it, in its thread): a TCPStore client
    serialises its calls, and the main thread's client may be in use by a collective check when
    the kernel asks. It blocks in `wait` (which releases the GIL) rather than polling, so an idle
    rank costs nothing. A request a stranger overwrote (`distnb.contract.signed`) is waited through
    while the kernel posts it again, then passed over (the kernel has given up on it by then);
    its reply is kept, for the kernel to ask for again (`distnb.contract.posts`).
    """

    STOP = "stop"

    def __init__(self, rank: int, connect: Callable[[], dist.Store]) -> None:
        self._rank = rank
        self._connect = connect
        self._next = 0
        self._thread = threading.Thread(target=self._serve, name="distnb-stacks", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, store: dist.Store) -> None:
        store.set(keys.stack_request(self._rank, self._next), self.STOP)
        self._thread.join(timeout=1.0)

    def _serve(self) -> None:
        store = self._connect()
        rank = self._rank
        while True:
            request = keys.stack_request(rank, self._next)
            try:
                store.wait([request], timedelta(days=365))
                asked = store.get(request)
            except ForgedValueError:
                self._next += 1
                continue
            if asked == self.STOP.encode():
                return
            reply, stack = keys.stack_reply(rank, self._next), main_stack()
            posts.drop(keys.stack_reply(rank, self._next - 1))  # the kernel asks for the last
            posts.post(store, reply, stack)
            self._next += 1
