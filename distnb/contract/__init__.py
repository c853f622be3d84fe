"""The contract between the kernel and the ranks, both sides of it in one place.

- `keys`: every key of the control plane's store, built here and only here;
- `signing`: values signed with the session's secret (nothing unsigned is used), over any store;
  `signed`: torch's store signed so; `storewire`: a client of torch's store without torch;
- `posts`: what a rank posted, posted again when a reader asks;
- `relay`: a debug adapter's connection carried over the store (ranks on other hosts);
- `folders`: a job's run folder (its endpoint and secret) for `python -m distnb.run`.

The requests and answers themselves are records (`distnb.records`, the agent's in
`distnb.records.agent`). `signed`, `posts` and `relay` are torch `Store`s or use them, so they
are imported where a store is at hand (the kernel imports them lazily): `import distnb` stays
cheap. A kernel attached to a job reaches its store through `storewire` and `signing`, which
need no torch.
"""
