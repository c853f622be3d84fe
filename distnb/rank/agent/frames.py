"""What the notebook asks of a stopped rank's frame, answered as records: the shape table
(`%dist_shapes`), replica digests (`%dist_diff`) and the overflow tracer (`%dist_overflow`), as
distnb's own ranks answer them, over the names the stopped frame sees (its locals over its
globals) instead of a cell's namespace.

Values travel too (`%dist_pull`, `%dist_push`): `Pull` answers a value pickled, `Push` binds values
in the frame. A stopped rank of an attached job runs these on its main thread, in the debugger
(`stopped.AgentPdb`, answer `Call`): the one place where the job's objects may be read without
racing its training loop. Overflow watches started here stay on when the rank goes on (they see its
next steps); `detach` removes them, so a detached job runs as it would have. Two queries need no
names: `Listen` starts the rank's debugpy for JupyterLab's panel, `RelayTo` connects it to a
notebook on another host (`panel`). The queries are `distnb.records.agent.FrameQuery`.
"""

from __future__ import annotations

import base64
import pickle
from collections.abc import Mapping, MutableMapping
from typing import Any

from distnb.records.agent import (
    Digests,
    FrameQuery,
    Listen,
    Pull,
    Push,
    RelayTo,
    Shapes,
    Watch,
    WatchReport,
)

__all__ = ["call", "lookup", "unwatch", "watching"]

_watched: set[str] = set()  # overflow watches started from the notebook


def call(query: FrameQuery, names: MutableMapping[str, Any], rank: int) -> Any:
    """The JSON-able answer to `query` over the frame's `names` (its locals over its globals;
    what is bound goes to its locals)."""
    match query:
        case Shapes(names=wanted, include_all=include_all):
            from distnb.rank.scan import scan_namespace

            scan = scan_namespace(names, list(wanted) or None, include_all=include_all, rank=rank)
            return scan.to_dict()
        case Digests(names=wanted, grads=grads, buffers=buffers):
            from distnb.rank.replicas import digests_of, entries_of

            targets = [{n: lookup(names, n)} for n in wanted]
            return [d.to_dict() for d in digests_of(list(entries_of(targets, grads, buffers)))]
        case Watch(name=name, options=options):
            from distnb.rank import overflow

            overflow.attach(name, lookup(names, name), options)
            _watched.add(name)
            return None
        case Listen():  # JupyterLab's panel: debugpy, started only now
            from distnb.rank.agent.panel import listen

            return listen().to_dict()
        case RelayTo(channel=channel):  # the panel, for a notebook on another host
            from distnb.rank.agent.panel import relay

            relay(channel)
            return None
        case Pull(path=path, limit=limit):
            from distnb.rank.data import pull_value

            found = pull_value(path, limit, names)
            if isinstance(found, tuple):
                what, data = found
                return [what, base64.b64encode(data).decode()]
            return found.to_dict()
        case Push(names=bound, values=values):
            for name, value in zip(bound, values, strict=True):
                names[name] = pickle.loads(base64.b64decode(value))  # a signed request only
            return None
        case WatchReport():
            from distnb.rank import overflow

            return {name: w.report().to_dict() for name, w in overflow.attached().items()}
    raise ValueError(f"unknown query {query!r}")


def lookup(names: Mapping[str, Any], path: str) -> Any:
    """`model` or `model.encoder` as the stopped frame sees it, or a NameError saying so."""
    from distnb.rank.scan import resolve

    return resolve(names, path, "the stopped frame has no {name!r}")


def unwatch() -> None:
    """Remove the overflow watches started from the notebook (at detach; on the main thread)."""
    if _watched:
        from distnb.rank import overflow

        for name in sorted(_watched):
            overflow.detach(name)
        _watched.clear()


def watching() -> bool:
    return bool(_watched)
