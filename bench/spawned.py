"""Ranks for the benchmarks: spawned processes around a TCPStore this process hosts.

`Spawned(world, worker, *args)` starts `worker(rank, world, port, *args, conn)` in each of
`world` processes and waits for each to send "ready"; `request(r)` sends one request to every
rank and returns their answers in rank order; `close()` sends None (the worker's cue to leave)
and makes sure every process is gone.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import socket
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any


class Spawned:
    def __init__(self, world: int, worker: Callable[..., None], *args: Any) -> None:
        import torch.distributed as dist

        self.world = world
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = dist.TCPStore(
            "127.0.0.1",
            self.port,
            None,
            True,
            timeout=datetime.timedelta(seconds=60),
            wait_for_workers=False,
        )
        ctx = mp.get_context("spawn")
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        for rank in range(world):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=worker, args=(rank, world, self.port, *args, child), daemon=True
            )
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)
        for conn in self.conns:
            assert conn.recv() == "ready"

    def request(self, request: Any) -> list[Any]:
        for conn in self.conns:
            conn.send(request)
        return [conn.recv() for conn in self.conns]

    def close(self) -> None:
        for conn in self.conns:
            conn.send(None)
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
