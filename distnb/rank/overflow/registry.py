"""The watches of this process by name, for the `%dist_overflow` magic: `attach`, `detach`,
`attached`. One registry per process, held here.
"""

from __future__ import annotations

from torch import nn

from distnb.rank.overflow.watch import Watch
from distnb.records.overflow import WatchOptions

__all__ = ["attach", "attached", "detach"]

_watches: dict[str, Watch] = {}


def attach(name: str, model: nn.Module, options: WatchOptions | None = None) -> Watch:
    """Watch `model` under `name` in this process, replacing an earlier watch of that name."""
    detach(name)
    _watches[name] = w = Watch(model, options)
    return w


def detach(name: str) -> bool:
    """Remove the watch registered under `name`; False if there was none."""
    w = _watches.pop(name, None)
    if w is not None:
        w.detach()
    return w is not None


def attached() -> dict[str, Watch]:
    """The watches registered in this process, by name."""
    return dict(_watches)
