"""A stopped rank's place in the DeviceMesh its code uses, for commands to a slice of ranks.

`ranks dp=1 p loss` at a debugger prompt sends `p loss` to the ranks whose coordinate along
the mesh dimension `dp` is 1 (`distnb.session.debugger.many`). The mesh is the one the stopped
code can see: the largest named `DeviceMesh` among the locals and globals of the stopped frame
and its callers (a training step's `mesh`, a cell's global `mesh`).
"""

from __future__ import annotations

from types import FrameType
from typing import Any

__all__ = ["coordinates"]

_DEPTH = 30  # callers looked at: a breakpoint sits a few calls below the code holding the mesh


def coordinates(frame: FrameType | None) -> dict[str, int]:
    """`{"dp": 1, "tp": 0}`: this rank's coordinate along each named dimension of the mesh
    `frame` sees; empty without one (or where this rank is not in it)."""
    mesh = _largest_mesh(frame)
    if mesh is None:
        return {}
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        return {}
    return {str(name): int(c) for name, c in zip(mesh.mesh_dim_names, coordinate, strict=True)}


def _largest_mesh(frame: FrameType | None) -> Any:
    try:
        from torch.distributed.device_mesh import DeviceMesh
    except ImportError:  # a torch without device meshes
        return None
    best = None
    for _ in range(_DEPTH):
        if frame is None:
            break
        for scope in (frame.f_locals, frame.f_globals):
            for value in list(scope.values()):
                named = isinstance(value, DeviceMesh) and bool(value.mesh_dim_names)
                if named and (best is None or value.ndim > best.ndim):
                    best = value
        frame = frame.f_back
    return best
