"""What `inside` uses of an attached job: its surface, as a Protocol.

`job.AttachedJob` binds `inside`'s functions as its methods (`AttachedJob.run = inside.run`).
Typed against this surface rather than the class, they depend on what an attached job offers,
not on the module that makes one, and `job` and `inside` do not import each other both ways.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence

    from distnb.ranklist import RankArg
    from distnb.records.agent import AgentRequest, Reply
    from distnb.records.collective import CollectiveEvent, Fingerprint
    from distnb.records.profiling import RankProfile
    from distnb.session.attach.link import Link
    from distnb.session.attach.prompts import JobPrompts

__all__ = ["JobSurface"]


class JobSurface(Protocol):
    """The attributes and methods of `AttachedJob` that its method modules use."""

    ranks: list[int]
    link: Link
    prompts: JobPrompts
    profiling: list[int]  # the ranks asked for a profile not reported yet
    profiled: dict[int, RankProfile]  # ... the profiles of those that have handed theirs over

    def open_prompts(self, wait_s: float) -> list[Any]: ...
    def pick(self, ranks: RankArg | None) -> list[int]: ...
    def events(self, last: int = 1000) -> dict[int, list[tuple[CollectiveEvent, Fingerprint]]]: ...
    def _ask(
        self, request: AgentRequest, ranks: Sequence[int] | None, timeout_s: float = 2.0
    ) -> dict[int, Reply]: ...
