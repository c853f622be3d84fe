"""The overflow tracer on a rank: per-module statistics on the device, read back once per step.

`watch(model)` hooks every module of `model` and, for each module call, looks at its inputs,
outputs and own weights (phase `forward`), at the gradient that flows into each output (phase
`backward`) and at each parameter's `.grad` once accumulated (phase `grad`). For each tensor it
computes, on the tensor's own device, the smallest and largest `|x|` and, when asked, counts of
zeros, NaN, Inf and values under the compute dtype's `tiny`.

Nothing is read back per tensor: each tensor's statistics are computed as it passes (so a value
that a later module overwrites in place is still seen as it was, and no tensor is kept alive) and
written into a small buffer on its device; Python only keeps each frame's metadata (module,
phase, tensor name, which statistics slot). A step ends at the root module's next forward (or at
`Watch.step()`); then one `.tolist()` per device reads the whole step back, one sum over the
floats says whether anything was non-finite, and only then are frames built: the first
non-finite one and those before it, fp16/bf16 values low on headroom, traced steps.
transformers' `DebugUnderflowOverflow` makes four host syncs per tensor, forward only.

Cost, and the `stats` option (`distnb.records.overflow.Stats`). Every statistic is one or more
passes over the tensor, so the tracer measures as little as it can prove enough:

- `fast` (default): `aminmax(x)`, one read-only pass: the largest `|x|` (so headroom, and whether
  there is NaN or Inf), the smallest only where all values share a sign; counts stay unknown
  (`None`) unless those prove them. No memory beyond a few scalars a tensor. The default
  because it is the one cheap enough to leave on (`docs/performance.md`).
- `auto`: `|x|` then `aminmax`, two passes. A smallest `|x|` above `tiny` and a finite largest
  one prove that there are no zeros, no underflow, no NaN and no Inf, so every count is known
  (0). Where they do not, the (module, phase, tensor) gets the statistics it lacks from the next
  step on: training steps repeat the same modules, so from the second step the counts are there
  where they matter.
- `full`: every count, every time (17 passes per tensor).

`auto` and `full` cost about 2x and 5-8x `fast`'s time, and on CPU keep two scratch buffers the
size of the largest tensor watched (measured: +3% to +50% peak memory on the benchmark models).

Known limits: inputs are read after the module ran, so a module that modifies its input in place
shows the modified values (the producer's `output` frame holds them as they were). `fast`/`auto`
learn nothing about counts at the step where a value first goes non-finite unless that tensor
had already asked for them; `full` always has them. The watch runs in the rank's own thread.

Modules: `watch` (the `Watch`, the step's end, and `watch()` that starts one), `hooks` (its hooks
on the model), `buffer` (statistics queued on the device and read back), `stats` (the
arithmetic), `frames` (from numbers to `Frame` records), `registry` (this process's watches by
name, for `%dist_overflow`), `nonfinite` (`detect`, one tensor's check). The options are
`distnb.records.overflow.WatchOptions`, checked once. Terms (step, micro-step, frame, compute
dtype, headroom) are defined in `distnb.records.overflow`.
"""

from __future__ import annotations

from distnb.rank.overflow.nonfinite import detect
from distnb.rank.overflow.registry import attach, attached, detach
from distnb.rank.overflow.watch import Watch, watch

__all__ = ["Watch", "attach", "attached", "detach", "detect", "watch"]
