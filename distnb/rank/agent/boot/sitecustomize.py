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

Plain `torchrun` opts in through the environment (`DISTNB_AGENT=1`, this folder first on
`PYTHONPATH`: `eval "$(python -m distnb.run --distnb-env)"`). This hook then also runs in
torchrun's own launcher (`torchrun`, `python -m torch.distributed.run`), and once torch is
imported there it hosts the job's control plane and makes the run folder (`distnb.run.host`),
as `python -m distnb.run` would: the workers inherit the run folder and start their agents.
"""

from __future__ import annotations

import atexit
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Callable
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


_hosted: Any = None  # the control plane torchrun's launcher hosts (kept alive here)
_failed: list[bool] = []  # the launcher ended with an exception (its exit status is then 1)


def _host() -> None:
    """In plain torchrun's launcher: what `python -m distnb.run` does before it calls torchrun."""
    global _hosted
    try:
        from distnb.run import HOST_VAR, RUN_VAR, host

        env = os.environ
        _hosted = host(env.get(RUN_VAR, ""), env.get(HOST_VAR) or "127.0.0.1", tuple(sys.argv))
    except Exception as exc:  # never the job's end: it runs unattachable
        print(
            f"distnb: no control plane for this job ({exc}); it runs without distnb's agent",
            file=sys.stderr,
        )
        return
    hook = sys.excepthook

    def failed(*exc: Any) -> None:
        _failed.append(True)
        hook(*exc)

    sys.excepthook = failed
    atexit.register(lambda: _hosted.end(1 if _failed else 0))


class _AfterTorch:
    """A finder that lets `import torch` run as usual, then calls `then` once."""

    def __init__(self, then: Callable[[], None]) -> None:
        self.then = then

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run, then = spec.loader.exec_module, self.then

        def exec_module(module: ModuleType) -> None:
            run(module)
            then()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _wanted() -> bool:
    env = os.environ
    mine = env.get("DISTNB_AGENT_PID")
    return bool(env.get("DISTNB_ATTACH")) and "RANK" in env and mine in (None, str(os.getpid()))


def _torchrun() -> bool:
    """Whether this process is torchrun's launcher (`torchrun`, `python -m torch.distributed.run`;
    `sys.orig_argv` holds `-m` and the module before `runpy` rewrites `sys.argv`)."""
    argv = getattr(sys, "orig_argv", sys.argv)
    module = any(argv[i : i + 2] == ["-m", "torch.distributed.run"] for i in range(len(argv)))
    return module or os.path.basename(sys.argv[0] if sys.argv else "") == "torchrun"


def _hosting() -> bool:
    env = os.environ
    opted = env.get("DISTNB_AGENT", "") not in ("", "0")
    return opted and not env.get("DISTNB_ATTACH") and "RANK" not in env and _torchrun()


def _after_torch(then: Callable[[], None]) -> None:
    if "torch" in sys.modules:
        then()
    else:
        sys.meta_path.insert(0, _AfterTorch(then))


_chain()
if _wanted():
    _after_torch(_start)
elif _hosting():
    _after_torch(_host)
