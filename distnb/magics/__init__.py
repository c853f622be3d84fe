"""IPython magics: `%load_ext distnb` registers them (`register`).

- `dist`: `DistMagics`, every magic a thin shell over one `Session` method;
- `attach`: `AttachMagics`, `%dist_attach` and `%%attached` over `distnb.attach`;
- `args`: parsing their arguments, each bad value a `UsageError` with the fix.
"""

from __future__ import annotations

from typing import Any

from distnb.magics.attach import AttachMagics
from distnb.magics.dist import DistMagics
from distnb.session.automode import AutoMode

__all__ = ["AttachMagics", "DistMagics", "register", "unregister"]


def register(shell: Any) -> None:
    """Register the magics on `shell` (once), with what they bring to IPython's own habits:
    `%debug` and `%pdb on` reach a failed rank, JupyterLab's debugger reaches the ranks of
    `%%allranks` cells, and auto mode's `%%local` and `%%dist_auto` exist."""
    from distnb.session.debugger import visual
    from distnb.session.debugger.postmortem import route_debugger

    if any(isinstance(m, DistMagics) for m in shell.magics_manager.registry.values()):
        return
    attach = AttachMagics(shell)
    magics = DistMagics(shell, attach)
    shell.register_magics(magics)
    shell.register_magics(attach)
    AutoMode.of(shell)
    route_debugger(shell, lambda: magics.session)
    visual.install(shell)


def unregister(shell: Any) -> None:
    """Undo `register`, and stop the running session."""
    from distnb.session.debugger import visual
    from distnb.session.debugger.postmortem import unroute_debugger

    for magics in list(shell.magics_manager.registry.values()):
        if isinstance(magics, AttachMagics) and magics.job is not None:
            magics.job.detach()
        if isinstance(magics, DistMagics):
            unroute_debugger(shell)
            visual.uninstall()
            if magics.session is not None:
                magics.session.stop()
