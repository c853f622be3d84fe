"""Two real gloo ranks that stay up for a whole test module and run scenarios on request.

The test process plays the kernel: it hosts the control plane (`TCPStore(is_master=True)`), starts
the ranks once (spawned processes; starting torch twice per test would cost seconds), and sends
them scenarios by name: a scenario is a module-level function `scenario(rank, **kwargs)` in a
test file, which each rank imports from its path. Results (or the exception, as plain data) come
back through a pipe. Nothing here mocks torch.distributed.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import multiprocessing as mp
import os
import signal
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from types import ModuleType
from typing import Any

# How long a scenario may take before the ranks are given up on: a bound that names a hang,
# far from the seconds a scenario takes (compiles and DDP's first step included) on a machine
# busy with other test runs.
ANSWER_S = 300.0

PG_PREFIX = "pg"
SESSION_PREFIX = "distnb"


@dataclass
class Outcome:
    """What one rank's scenario returned or raised."""

    rank: int
    value: Any = None
    error: str = ""  # exception class name, "" when it returned
    message: str = ""
    data: dict[str, Any] = field(default_factory=dict)  # e.g. the mismatch record as a dict
    seconds: float = 0.0

    def unwrap(self) -> Any:
        if self.error:
            raise AssertionError(f"rank {self.rank} raised {self.error}: {self.message}")
        return self.value


class Ranks:
    """A running pool of `world` gloo ranks; use as a context manager."""

    def __init__(self, scenario_file: str, world: int = 2, session_id: str = "") -> None:
        import torch.distributed as dist

        self.world = world
        self.port = _free_port()
        self.server = dist.TCPStore(
            "127.0.0.1",
            self.port,
            None,
            True,
            timeout=datetime.timedelta(seconds=30),
            wait_for_workers=False,
        )
        self.session_id = session_id or f"test{os.getpid()}"
        self.store = dist.PrefixStore(SESSION_PREFIX, self.server)
        ctx = mp.get_context("spawn")
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        for rank in range(world):
            parent, child = ctx.Pipe()
            args = (rank, world, self.port, self.session_id, scenario_file, child)
            proc = ctx.Process(target=_worker, args=args, daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)
        for outcome in self.collect(range(world), timeout=120):
            outcome.unwrap()

    def __enter__(self) -> Ranks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(
        self,
        scenario: Callable[..., Any] | str,
        ranks: Any = None,
        timeout: float = ANSWER_S,
        **kw: Any,
    ) -> list[Outcome]:
        """Run `scenario` on `ranks` (default: all) and wait for every one of them."""
        ranks = list(range(self.world)) if ranks is None else list(ranks)
        self.start(scenario, ranks, **kw)
        return self.collect(ranks, timeout)

    def start(self, scenario: Callable[..., Any] | str, ranks: Any = None, **kw: Any) -> None:
        name = scenario if isinstance(scenario, str) else scenario.__name__
        for r in range(self.world) if ranks is None else ranks:
            self.conns[r].send((name, kw))

    def collect(self, ranks: Any, timeout: float = ANSWER_S) -> list[Outcome]:
        deadline = time.monotonic() + timeout
        out = []
        for r in ranks:
            if not self.conns[r].poll(max(0.0, deadline - time.monotonic())):
                self.close()
                raise TimeoutError(f"rank {r} did not answer within {timeout} s")
            out.append(self.conns[r].recv())
        return out

    def interrupt(self, rank: int) -> None:
        os.kill(self.procs[rank].pid, signal.SIGINT)

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(BrokenPipeError, OSError):
                conn.send(None)
        for proc in self.procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        self.conns.clear()
        self.procs.clear()
        from distnb.rank.checked import exchange

        exchange.cleanup(self.session_id)  # boards of ranks that were killed, if any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _worker(
    rank: int, world: int, port: int, session_id: str, scenario_file: str, conn: Connection
) -> None:
    import torch
    import torch.distributed as dist

    from distnb.rank import checked

    torch.set_num_threads(1)
    try:
        client = dist.TCPStore(
            "127.0.0.1", port, None, False, timeout=datetime.timedelta(seconds=30)
        )
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(PG_PREFIX, client),
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=60),
        )
        checked.install(
            dist.PrefixStore(SESSION_PREFIX, client),
            rank=rank,
            world_size=world,
            session_id=session_id,
        )
        module = _load(scenario_file)
        conn.send(Outcome(rank, value="ready"))
    except BaseException as exc:  # report, don't hang the test process
        conn.send(Outcome(rank, error=type(exc).__name__, message=traceback.format_exc()))
        return
    while True:
        try:
            request = conn.recv()
        except (EOFError, KeyboardInterrupt):
            break
        if request is None:
            break
        name, kwargs = request
        conn.send(_run(getattr(module, name), rank, kwargs))
    checked.uninstall()
    dist.destroy_process_group()


def _run(scenario: Callable[..., Any], rank: int, kwargs: dict[str, Any]) -> Outcome:
    t0 = time.monotonic()
    try:
        value = scenario(rank, **kwargs)
        return Outcome(rank, value=value, seconds=time.monotonic() - t0)
    except BaseException as exc:
        mismatch = getattr(exc, "mismatch", None)
        data = mismatch.to_dict() if mismatch is not None else {}
        return Outcome(
            rank,
            error=type(exc).__name__,
            message=str(exc) or traceback.format_exc(),
            data=data,
            seconds=time.monotonic() - t0,
        )


def _load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("distnb_scenarios", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
