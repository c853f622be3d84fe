"""Imports that Ctrl-C cannot cut in half.

The kernel imports torch the first time a session starts (`%dist_start`), a second or more on a
busy machine. Ctrl-C in that second lands inside torch's own imports and leaves `torch` half
initialised in `sys.modules`: from then on every import of it fails ("partially initialized
module 'torch' has no attribute 'autograd'") until the kernel restarts. `import_whole` holds
Ctrl-C (SIGINT, which is also how Jupyter interrupts a kernel) until the import is done, then
raises the KeyboardInterrupt the user asked for: the start stops, the import stays whole.
"""

from __future__ import annotations

import importlib
import signal
import sys
import threading
from types import FrameType, ModuleType

__all__ = ["import_whole"]


def import_whole(name: str) -> ModuleType:
    """`importlib.import_module(name)`, with Ctrl-C held until it returns (see the module)."""
    if name in sys.modules or threading.current_thread() is not threading.main_thread():
        return importlib.import_module(name)  # imported already, or no signal can reach it
    held: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        held.append(signum)

    before = signal.signal(signal.SIGINT, hold)
    try:
        module = importlib.import_module(name)
    finally:
        signal.signal(signal.SIGINT, before)
    if held:
        raise KeyboardInterrupt(f"interrupted while importing {name} (the import was finished)")
    return module
