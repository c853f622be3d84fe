"""What `inside` uses of an attached job: its surface, as a Protocol.

`job.AttachedJob` binds `inside`'s functions as its methods (`AttachedJob.run = inside.run`).
Typed against this surface rather than the class, they depend on what an attached job offers,
not on the module that makes one, and `job` and `inside` do not import each other both ways.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from distnb.ranklist import RankArg
    from distnb.session.attach.link import Link
    from distnb.session.attach.prompts import JobPrompts

__all__ = ["JobSurface"]


class JobSurface(Protocol):
    """The attributes and methods of `AttachedJob` that its method modules use."""

    ranks: list[int]
    link: Link
    prompts: JobPrompts

    def open_prompts(self, wait_s: float) -> list[Any]: ...
    def pick(self, ranks: RankArg | None) -> list[int]: ...
