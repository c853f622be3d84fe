"""The processes and launchers of a session: what runs where, and what died.

- `launch.Cluster`: ipyparallel's controller and engines, launched, registered and ended;
- `engines`: the engine kinds (`Local`, `Mpi`, any other launcher) and what they share;
  `ssh.Ssh` and `slurm.Slurm` start engines on other machines;
- `members`: every process the cluster started, its role, whether it died and how;
- `processes`: reads and signals of processes (psutil, pidfds);
- `deaths`: what a death means, in words (the session's reason, a rank's death report);
- `oom`: whether the OOM killer did it;
- `stopped`: what a stop ended, host by host, and what it could not reach.

Only this package (and the cell runs, which drive `AsyncResult`s) talks to ipyparallel.
"""

from distnb.session.cluster.launch import Cluster

__all__ = ["Cluster"]
