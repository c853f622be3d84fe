"""The agent's second way in: `ProcessGroup`'s methods, as `torch.distributed` calls them.

The tape sees every collective at the dispatcher's ops (`distnb.rank.checked.intercept`), but
the trip from the dispatcher into a Python kernel and back (the arguments boxed, a
`ScriptObject` for the group and one for the reduce op, read through a TorchScript method)
costs more than recording the call: tens of microseconds per collective on this machine, a few
percent of a small training step. `torch.distributed`'s functions end in a method of the group
with an options object (`group.allreduce([t], opts)`); wrapped here by the checked runtime's own
entry (`distnb.rank.checked.methods.entry`), those calls are recorded from their Python
arguments and run below the kernels' key, so they never reach the kernels. Other callers (DDP's
reducer, functional collectives, compiled graphs, the methods' other overloads) still do.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from distnb.rank.checked import methods

__all__ = ["GroupMethods"]


class GroupMethods:
    """The wrapped methods; `restore` puts torch's back (tests, and an agent that stops)."""

    def __init__(self, interceptor: Any) -> None:
        self._originals: list[tuple[str, Any]] = []
        for name in methods.DESCRIBE:
            raw = vars(dist.ProcessGroup).get(name)
            if raw is None:  # this torch has no such method
                continue
            method = getattr(dist.ProcessGroup, name)
            self._originals.append((name, raw))
            setattr(dist.ProcessGroup, name, methods.entry(name, method, interceptor, method))

    def restore(self) -> None:
        for name, raw in reversed(self._originals):
            setattr(dist.ProcessGroup, name, raw)
        self._originals.clear()
