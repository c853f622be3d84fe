"""distnb's process-start hook for the workers of `python -m distnb.run` (see distnb.run).

Python imports `sitecustomize` at start-up from the first `sys.path` entry that has one;
`distnb.run` puts this folder first on the workers' `PYTHONPATH`. This module runs the
`sitecustomize` it shadows, if any, then, in a worker of an attachable job (the run folder in
`DISTNB_ATTACH`, torchrun's `RANK` set), waits for the script to import torch and starts
distnb's agent then (`distnb.rank.agent.start`). Not earlier: a script may set environment
variables before it imports torch, and they must work as they would without distnb.

Processes the worker starts in turn (DataLoader workers, compile workers) inherit the
environment; `DISTNB_AGENT_PID` (set by the agent) keeps them from starting agents of their own.
Nothing here may stop the job: an agent that cannot start says why on stderr, and the job runs.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))


def _chain() -> None:
    """Run the `sitecustomize` later on `sys.path` that this one shadows."""
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == _HERE:
            continue
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return


def _start() -> None:
    try:
        from distnb.rank.agent import start

        start()
    except Exception as exc:  # never the job's end: it runs without the agent
        print(
            f"distnb: the agent did not start ({exc!r}); the job runs without it", file=sys.stderr
        )


class _AfterTorch:
    """A finder that lets `import torch` run as usual, then starts the agent once."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _start()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _wanted() -> bool:
    env = os.environ
    mine = env.get("DISTNB_AGENT_PID")
    return bool(env.get("DISTNB_ATTACH")) and "RANK" in env and mine in (None, str(os.getpid()))


_chain()
if _wanted():
    if "torch" in sys.modules:
        _start()
    else:
        sys.meta_path.insert(0, _AfterTorch())
