"""What the tools ask of ranks, whoever started them: the target the magics act on.

A session's ranks and an attached job's ranks are the same thing to the tools: ranks you can
call into, a live namespace (`distnb.Session`) or the frames stopped ranks are stopped in
(`distnb.session.attach.AttachedJob`). `%dist_shapes`, `%dist_diff`, `%dist_overflow`,
`%dist_pull`, `%dist_push`, `%dist_timeline`, `%dist_profile` and `%dist_status` act on the
current target: the attached job while one is attached, else the session
(`distnb.magics.dist.DistMagics.target`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from distnb.ranklist import RankArg
    from distnb.views.overflow import OverflowView
    from distnb.views.profiling import ProfileView
    from distnb.views.replicas import ReplicaView
    from distnb.views.shapes import ShapeTableView

__all__ = ["Target"]


class Target(Protocol):
    """Ranks the tools call into (see the module)."""

    def shapes(
        self, names: Sequence[str] | None = None, all: bool = False, ranks: RankArg | None = None
    ) -> ShapeTableView: ...
    def diff(
        self,
        *names: str,
        grads: bool = False,
        buffers: bool = False,
        atol: float = 0.0,
        expect: str = "same",
        ranks: RankArg | None = None,
    ) -> ReplicaView: ...
    def overflow(self, name: str, ranks: RankArg | None = None, **options: Any) -> None: ...
    def overflow_report(self, ranks: RankArg | None = None) -> dict[str, OverflowView]: ...
    def pull(
        self, name: str, ranks: RankArg | None = None, limit: int | None = None
    ) -> list[Any]: ...
    def push(
        self, ranks: RankArg | None = None, limit: int | None = None, **values: Any
    ) -> None: ...
    def profile(self, steps: int | None = None, ranks: RankArg | None = None) -> None: ...
    def profile_report(self) -> ProfileView: ...
    def status(self) -> Any: ...
