"""The test harness: what the tests and the benches both start and drive, real parts only.

- `processes`: processes watched and ended; the time a fault gets to be named (`NAMED_S`);
  Ctrl-C once ranks reach the code to interrupt;
- `kernel_driver`: a real Jupyter kernel driven as a frontend drives it; `notebooks`: the
  notebooks of notebooks/ run in one; `lab`: JupyterLab in a real Chromium;
- `gloo`: plain processes in a gloo process group (torch.multiprocessing), no ipyparallel;
- `jobs` (with the scripts `train.py`, `circle.py`, `ddp_train.py`): real torchrun jobs to
  attach to;
  `thirdparty`: other projects' own distributed scripts and torchrun's verdict on them;
  `frameworks`: scripts as Lightning's, Fabric's, Ignite's, Accelerate's and Trainer's users
  write them;
- `docs`: the guide's examples run, and what they print compared with what the pages show;
- `hosts`, `slurm`, `stranger`, `host_jobs`: rehearsal hosts (network namespaces with an sshd,
  a Slurm cluster on them), a stranger on their network, and jobs across them.
"""
