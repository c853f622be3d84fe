"""distnb's agent: what a rank of a job distnb did not start runs, so the notebook can attach.

Loaded in every worker of `python -m distnb.run` (`boot/sitecustomize.py`, once the script has
imported torch), it is small and passive:

- `tape`: the collectives the rank enters (through the checked runtime's interception at the
  dispatcher ops, `distnb.rank.checked.intercept`, with the checks off): what, on which group,
  seq, call site, shapes; the last N in a ring, the open one per group;
- `serve`: a daemon thread that answers the notebook's requests through the job's signed
  control plane (a PULL model: nothing is written to the store per collective, an idle rank
  costs a blocked thread), from the tape and the main thread's live stack;
- `safepoints`: stopping on request, at the next collective or step boundary, or at a breakpoint
  set from the notebook, in distnb's rank debugger (`distnb.rank.debug`), its prompts answered
  in the notebook; holding peers before their next collective meanwhile; detaching.

This package's `__init__` imports nothing heavy: the boot hook imports it before torch.
"""

from __future__ import annotations

__all__ = ["start"]


def start() -> None:
    """Start the agent in this worker (its settings come from the environment)."""
    from distnb.rank.agent.core import Agent

    Agent.from_environment().start()
