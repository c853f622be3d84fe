"""What the method modules beside `core` use of a session: its public surface, as a Protocol.

`core.Session` binds the method modules' functions as its methods (`Session.pull = data.pull`).
Typed against this surface rather than the class, they depend on what a session offers, not on
the module that makes one, and `core` and they do not import each other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from distnb.ranklist import RankArg
    from distnb.records.cell import RankInfo
    from distnb.session.cluster import Cluster
    from distnb.session.runs.request import CellResult

__all__ = ["SessionSurface"]


class SessionSurface(Protocol):
    """The public methods and properties of `distnb.Session` that its method modules use."""

    ranks: tuple[RankInfo, ...]

    @property
    def running(self) -> bool: ...
    @property
    def runs(self) -> int: ...
    @property
    def broken(self) -> str: ...
    @property
    def cluster(self) -> Cluster | None: ...

    def call(
        self,
        fn: Callable[..., Any],
        *args: Any,
        ranks: RankArg | None = None,
        timeout: float | None = 60.0,
    ) -> list[Any]: ...
    def targets(self, ranks: RankArg | None) -> list[RankInfo]: ...
    def require_running(self, notice: bool = False) -> None: ...
    def run(
        self,
        code: str,
        ranks: RankArg | None = None,
        timeout: float | None = None,
        check: bool = True,
        shapes: bool = False,
        timeline: bool = False,
    ) -> CellResult: ...
    def debugs(self, error: BaseException | None) -> bool: ...
    def debug(self, rank: int | None = None) -> None: ...
