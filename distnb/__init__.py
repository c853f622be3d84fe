"""distnb: debug distributed PyTorch interactively, from Jupyter or IPython.

    %load_ext distnb
    %dist_start -n 2
    %%allranks
    x = torch.ones(3) * rank
    dist.all_reduce(x)
    print(rank, x)

Importing distnb is cheap: torch, ipyparallel and ipywidgets load when a session starts.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distnb.session import Session

__all__ = ["Session", "check_finite", "load_ipython_extension", "start", "unchecked"]
__version__ = "0.1.0"


def start(n: int | None = None, **options: Any) -> Session:
    """Start `n` ranks and return the running `Session`; see `distnb.session.start`."""
    from distnb.session import start as _start

    return _start(n, **options)


def unchecked() -> AbstractContextManager[None]:
    """On a rank: run the enclosed collectives without distnb's checks."""
    from distnb.rank.checked import unchecked as _unchecked

    return _unchecked()


def check_finite(enabled: bool = True) -> AbstractContextManager[None]:
    """On a rank: inside the block, reductions refuse NaN/Inf inputs and name the rank(s) whose
    input held them (one `isfinite` pass and host sync per tensor)."""
    from distnb.rank.checked import finite_checks

    return finite_checks(enabled)


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext distnb`: register the magics (loading twice is harmless)."""
    from distnb.magics import DistMagics

    if not any(isinstance(m, DistMagics) for m in ipython.magics_manager.registry.values()):
        ipython.register_magics(DistMagics(ipython))


def unload_ipython_extension(ipython: Any) -> None:
    """`%unload_ext distnb`: stop the running session."""
    from distnb.magics import DistMagics

    for magics in ipython.magics_manager.registry.values():
        if isinstance(magics, DistMagics) and magics.session is not None:
            magics.session.stop()


def __getattr__(name: str) -> Any:
    if name == "Session":
        from distnb.session import Session

        return Session
    raise AttributeError(f"module 'distnb' has no attribute {name!r}")
