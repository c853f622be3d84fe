"""Why a rank did not send a value the kernel asked for (`Session.pull`).

A rank checks what it was asked for before sending it: that the name exists, that it fits the
size limit, that it pickles. When it does not, it answers with a `Refusal` instead of raising,
and the kernel builds one message naming every rank's reason
(`distnb.session.data.refusal_message`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from distnb.records.codec import Record

__all__ = ["Reason", "Refusal"]


class Reason(str, Enum):
    MISSING = "missing"
    TOO_LARGE = "too large"
    UNPICKLABLE = "unpicklable"


@dataclass(frozen=True, slots=True)
class Refusal(Record):
    """A rank's reason not to send `name`: `what` it holds there (`tensor float32[4, 5]`,
    `list of 3 items`), its size in bytes (pickled, or its tensors' bytes) and the error. The
    kernel knows which rank answered, so the record does not say."""

    name: str
    reason: Reason
    what: str = ""
    nbytes: int = 0
    detail: str = ""
