"""The kernel's side of distnb: a session of ranks, in rooms by concern.

- `starting`: `start`, the one way a session begins (`distnb.start`, `%dist_start`);
- `core`: the `Session` (start, stop, runs, calls on ranks); its method modules beside it:
  `status` (`%dist_status`), `data` (pull, push), `inspection` (shapes, overflow, timelines),
  `replicas` (`%dist_diff`), `automode` (`%dist_auto`);
- `options`: how a session starts, parsed once; `control`: the control plane (a TCPStore the
  kernel hosts); `joining`: engines becoming ranks of one process group; `clocks`: ranks' clocks;
- `cluster/`: the processes and launchers (engine kinds: local, MPI, ssh, Slurm), what died
  and how;
- `runs/`: one cell or script on the ranks: its request, the wait loop, the referee that
  releases waiting ranks, deadlocks, failures;
- `debugger/`: the debugger's kernel side: the text desk, the DAP relay of JupyterLab's visual
  debugger, post-mortem.
"""

from __future__ import annotations

from distnb.session.core import Session
from distnb.session.starting import start

__all__ = ["Session", "start"]
