"""What the notebook asks of a stopped rank's frame, answered as records: the shape table
(`%dist_shapes`), replica digests (`%dist_diff`) and the overflow tracer (`%dist_overflow`), as
distnb's own ranks answer them, over the names the stopped frame sees (its locals over its
globals) instead of a cell's namespace.

A stopped rank of an attached job runs these on its main thread, in the debugger
(`stopped.AgentPdb`, answer `CALL`): the one place where the job's objects may be read without
racing its training loop. Overflow watches started here stay on when the rank goes on (they see
its next steps); `detach` removes them, so a detached job runs as it would have. Two requests
need no names: `listen` starts the rank's debugpy for JupyterLab's panel, `relay` connects it
to a notebook on another host (`panel`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["call", "lookup", "unwatch", "watching"]

_watched: set[str] = set()  # overflow watches started from the notebook


def call(request: Mapping[str, Any], names: Mapping[str, Any], rank: int) -> Any:
    """The JSON-able answer to `request` (`{"fn": ..., ...}`) over the frame's `names`."""
    fn = request.get("fn")
    if fn == "shapes":
        from distnb.rank.scan import scan_namespace

        wanted = list(request.get("names") or []) or None
        include_all = bool(request.get("all"))
        return scan_namespace(names, wanted, include_all=include_all, rank=rank).to_dict()
    if fn == "digests":
        from distnb.rank.replicas import digests_of, entries_of

        targets = [{n: lookup(names, n)} for n in request["names"]]
        found = list(entries_of(targets, bool(request.get("grads")), bool(request.get("buffers"))))
        return [d.to_dict() for d in digests_of(found)]
    if fn == "overflow":
        from distnb.rank import overflow
        from distnb.records.overflow import WatchOptions

        name = str(request["name"])
        overflow.attach(name, lookup(names, name), WatchOptions.from_dict(request["options"]))
        _watched.add(name)
        return None
    if fn == "listen":  # JupyterLab's panel: debugpy, started only now
        from distnb.rank.agent.panel import listen

        return listen()
    if fn == "relay":  # the panel, for a notebook on another host
        from distnb.rank.agent.panel import relay

        relay(str(request["channel"]))
        return None
    if fn == "overflow_report":
        from distnb.rank import overflow

        return {name: w.report().to_dict() for name, w in overflow.attached().items()}
    raise ValueError(f"unknown request {fn!r}")


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
