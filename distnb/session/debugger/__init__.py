"""The debugger's kernel side, the twin of `distnb.rank.debug`.

- `desk`: the text debugger: ranks' prompts asked in the notebook, one at a time;
- `visual`: JupyterLab's visual debugger on the ranks: the frontend's debug requests relayed
  to each rank's debugpy (`dap`: the Debug Adapter Protocol client), ranks shown as threads;
- `postmortem`: opening a failed rank's debugger (`%dist_debug`, IPython's `%debug`).
"""
