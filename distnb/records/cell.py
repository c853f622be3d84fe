"""Records about ranks and cells: who each rank is, how its part of a cell ended.

Terms, defined once for the whole package:

- **rank**: a process in the job, numbered 0..world_size-1 by distnb (ipyparallel's engine ids
  are not ranks).
- **cell**: one `%%allranks` execution; its number is the kernel's execution count when there is
  one, else a counter of the session.
- **beacon**: what a rank last said about itself through the control plane (the cell it runs,
  the collective it waits at), readable by the kernel while the rank is blocked.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from enum import Enum

# Set in an engine's environment by launchers that name its host (ssh: the host as the user
# gave it), so that a stop can say which ranks a silent host held.
LAUNCHED_ON_VAR = "DISTNB_LAUNCHED_ON"


@dataclass(frozen=True, slots=True)
class RankInfo:
    """One rank of a running session, as `session.status()` lists it."""

    rank: int
    local_rank: int
    engine_id: int
    host: str
    pid: int
    device: str
    backend: str
    address: str = ""  # where the rank reaches the control plane from (its host's address)
    launched_on: str = ""  # the host its launcher named (ssh: as given in `hosts`), if any

    @property
    def here(self) -> bool:
        """Whether the rank runs on the machine that asks (the kernel's, in a session)."""
        return self.host == socket.gethostname()


class RankState(str, Enum):
    """How a rank's part of a cell ended (or that it has not)."""

    FINISHED = "finished"
    FAILED = "failed"
    RUNNING = "running"
    DIED = "died"
    INTERRUPTED = "interrupted"


@dataclass(frozen=True, slots=True)
class RankFailure:
    """An exception a rank raised in a cell, as text: no live objects cross processes."""

    rank: int
    ename: str
    evalue: str
    traceback: str

    @property
    def summary(self) -> str:
        return f"{self.ename}: {self.evalue}" if self.evalue else self.ename


@dataclass(frozen=True, slots=True)
class RankReport:
    """One rank's line in a hang report: its state and, if still running, where it is."""

    rank: int
    state: RankState
    detail: str = ""
    stack: str = ""


@dataclass(frozen=True, slots=True)
class RankSpec:
    """What the kernel tells an engine when it makes it a rank."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    backend: str
    store_host: str
    store_port: int
    session_id: str
    check: bool = True
    pg_timeout_s: float = 600.0
    secret: str = ""  # hex; the control plane is signed with it when it leaves loopback


@dataclass(frozen=True, slots=True)
class EngineProbe:
    """What an engine says about itself before it gets a rank."""

    engine_id: int
    host: str
    pid: int
    cuda_devices: int
    mpi_rank: int | None = None
