"""The control plane's store, signed, as a torch `Store`: what the ranks, the launcher and a
session's kernel use (process groups rendezvous through it). The signing itself, and what a
forged value means to each reader, is `distnb.contract.signing`'s, shared with the kernel's
torch-free client of an attached job's store (`distnb.contract.storewire`).
"""

from __future__ import annotations

import torch.distributed as dist

from distnb.contract import signing
from distnb.contract.signing import TAG_BYTES, forged_message, take_forged

__all__ = ["TAG_BYTES", "ForgedValueError", "SignedStore", "forged_message", "take_forged"]


class ForgedValueError(signing.ForgedValueError, dist.DistStoreError):
    """`signing.ForgedValueError`, and a `DistStoreError` as the store's other errors are, for
    code that handles a torch store's errors alike."""


class SignedStore(signing.Signed, dist.Store):
    """`inner` with every value signed with `secret` (`distnb.contract.signing`)."""

    forged_error = ForgedValueError

    def __init__(self, inner: dist.Store, secret: bytes, timeout_s: float = 30.0) -> None:
        dist.Store.__init__(self)
        signing.Signed.__init__(self, inner, secret, timeout_s)
