"""What the agent's parts use of the agent: its surface, as a Protocol.

`core.Agent` makes the parts (`safepoints.SafePoints`, `serve.Server`) and hands itself to them.
Typed against this surface rather than the class, they depend on what an agent offers, not on
the module that makes one, and `core` and they do not import each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from distnb.rank.agent.tape import Tape

__all__ = ["AgentSurface"]


class AgentSurface(Protocol):
    """The attributes of `distnb.rank.agent.core.Agent` that its safe points and server use."""

    rank: int
    world_size: int
    local_rank: int
    step: int | None  # optimizer steps taken; None until the first
    tape: Tape
    store: Any  # the signed client of the job's control plane

    def connect_raw(self) -> tuple[Any, Any]: ...
