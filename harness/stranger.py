"""A stranger on the network: it reaches the control plane's port and writes random bytes over
every key of the session it can list, once or again and again (issue 35: `TCPStore(MASTER_ADDR,
MASTER_PORT, is_master=False)`, then `set(k, os.urandom(48))` for every `list_keys()`)."""

from __future__ import annotations

import datetime
import os
import threading
import time

import torch.distributed as dist


class Stranger:
    """Writes over the keys under `prefix` (a session's id) in the store at `address`:`port`."""

    def __init__(self, address: str, port: int, prefix: str) -> None:
        timeout = datetime.timedelta(seconds=10)
        self.store = dist.TCPStore(address, port, is_master=False, timeout=timeout)
        self.prefix = prefix
        self.written = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def overwrite_all(self) -> int:
        """Every key of the session, once; how many there were."""
        names = [k for k in self.store.list_keys() if k.startswith(self.prefix)]
        for name in names:
            self.store.set(name, os.urandom(48))
        self.written += len(names)
        return len(names)

    def keep_writing(self, seconds: float = 3600.0) -> Stranger:
        """Again and again, from a thread, for `seconds` or until `stop`."""
        until = time.monotonic() + seconds

        def write() -> None:
            while not self._stop.wait(0.005) and time.monotonic() < until:
                try:
                    self.overwrite_all()
                except RuntimeError:  # the control plane went away (a stop)
                    return

        self._stop.clear()
        self._thread = threading.Thread(target=write, name="stranger", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
