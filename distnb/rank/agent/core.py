"""The agent of one rank: its settings, its store connections, and its start.

The settings come from the worker's environment: the run folder (`DISTNB_ATTACH`, which holds
the control plane's endpoint and secret) and torchrun's `RANK`, `WORLD_SIZE` and `LOCAL_RANK`.
Every value the agent writes or reads in the job's store is signed with the run's secret
(`distnb.contract.signed`), on loopback too: another user of the machine can reach a loopback port.
"""

from __future__ import annotations

import json
import os
import socket
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook

from distnb.contract import keys
from distnb.contract.folders import RunFolder
from distnb.contract.signed import SignedStore
from distnb.rank.agent import ending, panel
from distnb.rank.agent.entries import GroupMethods
from distnb.rank.agent.safepoints import SafePoints
from distnb.rank.agent.serve import Server
from distnb.rank.agent.tape import Tape
from distnb.rank.checked.intercept import Interceptor
from distnb.records.agent import AgentInfo
from distnb.run import ATTACH_VAR

__all__ = ["PID_VAR", "Agent"]

PID_VAR = "DISTNB_AGENT_PID"  # the process the agent runs in: its children start none


class Agent:
    """One rank's agent: `tape` (its collectives), `safepoints` (stops), `server` (answers)."""

    def __init__(self, folder: Path, rank: int, world_size: int, local_rank: int) -> None:
        job = self.folder = RunFolder(folder)
        self.endpoint = job.endpoint()
        self._secret = bytes.fromhex(job.secret())
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.step: int | None = None  # optimizer steps taken; None until the first
        self.tape = Tape(rank)
        self.interceptor = Interceptor()
        self.store: Any = None
        self.safepoints: SafePoints | None = None
        self.profiling: Any = None  # distnb.rank.profiling, once the notebook asks a profile

    @classmethod
    def from_environment(cls) -> Agent:
        env = os.environ
        return cls(
            Path(env[ATTACH_VAR]),
            int(env["RANK"]),
            int(env.get("WORLD_SIZE", "1")),
            int(env.get("LOCAL_RANK", "0")),
        )

    def connect(self) -> Any:
        """A client of the job's control plane, signed (each thread that waits has its own)."""
        return self.connect_raw()[1]

    def connect_raw(self) -> tuple[Any, Any]:
        """(the client unsigned, for waits that must not wait on a stranger's value; signed)."""
        e = self.endpoint
        client = dist.TCPStore(e.host, e.port, is_master=False, timeout=timedelta(seconds=30))
        raw = dist.PrefixStore(e.run, client)
        return raw, SignedStore(raw, self._secret)

    def start(self) -> None:
        os.environ[PID_VAR] = str(os.getpid())
        self.store = self.connect()
        self.safepoints = SafePoints(self)
        panel.serve_with(self.connect)  # JupyterLab's panel from another host, if asked
        register_optimizer_step_post_hook(self._stepped)
        self.interceptor.install(self.tape.record, self.tape.record)
        GroupMethods(self.interceptor)  # `torch.distributed`'s calls, without the kernels' trip
        me = AgentInfo(
            socket.gethostname(), os.getpid(), self.local_rank, self.world_size, time.time()
        )
        self.store.set(keys.agent_rank(self.rank), json.dumps(me.to_dict()))
        server = Server(self)
        server.start()
        ending.install(self.rank, self.folder, server.snapshot)

    def _stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.step = (self.step or 0) + 1
        if self.profiling is not None:
            self.profiling.at_step(self.rank)
        points = self.safepoints
        if points is not None and points.armed:
            points.at_step()
