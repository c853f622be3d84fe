"""A `%dist_run` sees what a fresh torchrun worker sees; the cells keep what they had.

A torchrun worker is a new process: no library singleton (Accelerate's `PartialState`), module
cache, logging or warnings setup, environment change, random state or torch switch survives
from the run before. A rank's process lives for the whole session, so each piece of that state
is captured when the rank joins (`remember`), set back to it when a run starts, and the cells'
own put back when the run ends (`as_fresh`): `reset`, over parts of that state each captured,
made fresh and put back. Which modules a run imports afresh, and letting go of them after it:
`modules` (and `hooks`, the run's `atexit` and fork handlers); what those modules patch into
torch and `logging` (Lightning's `torch.compile`): `patches`; the interpreter's state:
`interpreter`; what tells a notebook from a script (`sys.ps1`, IPython's builtins and shell,
which frameworks probe): `notebook`; torch's switches: `switches`; torch's config modules, the
random generators and process groups: `torchstate`.

Why not a new process per run: the rank's process carries the engine (its output, stdin and
debugger, live stacks, Ctrl-C, death reports) and the checked runtime; a process forked per run
would need every one of them carried across. The reset keeps them as they are, costs
milliseconds (`bench/bench_runs.py`), and states its limits: what it cannot reach is state held
in compiled code loaded before the run (numpy's, tokenizers', torch's C++ registries and
caches), threads a run starts, and files it leaves open. A run's `atexit` handlers run at its
end, as at a worker's exit, and its fork handlers are dropped then (`hooks`).
"""

from __future__ import annotations

from distnb.rank.fresh.reset import (
    Made,
    as_fresh,
    end_aside,
    forget,
    joins,
    remember,
    remembered,
    running,
    set_aside,
    unchanged,
)

__all__ = [
    "Made",
    "as_fresh",
    "end_aside",
    "forget",
    "joins",
    "remember",
    "remembered",
    "running",
    "set_aside",
    "unchanged",
]
