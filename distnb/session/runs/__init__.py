"""One cell or script on the ranks, from the kernel's side.

- `request`: what a run is asked to do (`CellRequest`) and what it did (`CellResult`);
  `scripts`: a script as a run (`%dist_run`);
- `run`: the wait loop (`CellRun`): output as it comes, prompts, deaths, timeouts, Ctrl-C;
  `endings`: the errors that end a run early (a hang report, a death report);
- `referee`: releases ranks that wait at a collective a peer will never reach (its sentences
  and circles are `distnb.judgement`'s);
- `failures`: what ranks send back when things go wrong, as distnb's records and errors.
"""
