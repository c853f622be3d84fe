"""The overflow tracer on a rank: per-module statistics on the device, read back once per step.

`watch(model)` hooks every module of `model` and, for each module call, looks at its inputs,
outputs and own weights (phase `forward`), at the gradient that flows into each output (phase
`backward`, a tensor hook on the output) and at each parameter's `.grad` once accumulated (phase
`grad`). For each tensor it computes, on the tensor's own device, the smallest and largest `|x|`
and, when asked, counts of zeros, NaN, Inf and values under the compute dtype's `tiny`.

Nothing is read back per tensor: the statistics stay on the device as 0-d tensors, and Python only
keeps each frame's metadata (module, phase, tensor name, which statistics slot). A step ends at the
root module's next forward (or at `Watch.step()`); then one `torch.cat(...).tolist()` per device
reads the whole step back, the frames get their numbers, and the tracer looks for the first
non-finite value and for low fp16/bf16 headroom. transformers' `DebugUnderflowOverflow` makes four
host syncs per tensor, forward only.

Cost, and the `stats` option. Every statistic is one or more passes over the tensor, so the tracer
measures as little as it can prove enough:

- `fast`: `aminmax(x)`, one read-only pass: the largest `|x|` (so headroom, and whether there is
  NaN or Inf), the smallest only where all values share a sign; counts stay unknown (`None`)
  unless those prove them. The cheapest mode, for long runs.
- `auto` (default): `|x|` then `aminmax`, two passes. A smallest `|x|` above `tiny` and a finite
  largest one prove that there are no zeros, no underflow, no NaN and no Inf, so every count is
  known (0). Where they do not, the (module, phase, tensor) gets the statistics it lacks from
  the next step on: training steps repeat the same modules, so from the second step the counts
  are there where they matter.
- `full`: every count, every time (17 passes per tensor).

Known limits: inputs are read after the module ran, so a module that modifies its input in place
shows the modified values (the producer's `output` frame holds them as they were). `fast`/`auto`
learn nothing about counts at the step where a value first goes non-finite unless that tensor
had already asked for them; `full` always has them. The watch runs in the rank's own thread; a
step's statistics are kept as a few scalars per tensor until its readback.

Terms (step, micro-step, frame, compute dtype, headroom) are defined in `distnb.records.overflow`.
"""

from __future__ import annotations

import math
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, Literal

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.utils.hooks import RemovableHandle

from distnb.errors import ConfigError, DistnbWarning, NonFiniteError, OverflowStop
from distnb.rank.overflow_stats import (
    ALL,
    NONFINITE,
    SIGNED,
    UNDER,
    ZEROS,
    Decoded,
    Scratch,
    Slot,
    StepBuffer,
    limits,
)
from distnb.records.overflow import Frame, Phase, RankOverflowReport

__all__ = ["Watch", "attach", "attached", "detach", "detect", "watch"]

StatsMode = Literal["auto", "fast", "full"]
StepOn = Literal["forward", "explicit"]
PHASES = tuple(p.value for p in Phase)
LOW_PRECISION = (torch.float16, torch.bfloat16)
FORWARD, BACKWARD, GRAD = Phase.FORWARD, Phase.BACKWARD, Phase.GRAD

# order, micro, module path, class, phase, tensor name, slot, compute dtype
FrameMeta = tuple[int, int, str, str, Phase, str, int, torch.dtype]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


_INPUT = tuple(f"input[{i}]" for i in range(16))
_OUTPUT = tuple(f"output[{i}]" for i in range(16))


def _named_leaves(obj: Any, prefix: str, fast: tuple[str, ...]) -> list[tuple[str, torch.Tensor]]:
    """Tensor leaves of `obj` named the way you would index them: `input[0]`, `output['logits']`.

    Tuples, lists and dicts (a transformers `ModelOutput` is one) are walked here, faster than
    torch's pytree; other registered pytree nodes go through pytree; other objects are skipped.
    `fast` holds ready-made names for the first items of a top-level tuple.
    """
    if isinstance(obj, torch.Tensor):
        return [(prefix, obj)]
    out: list[tuple[str, torch.Tensor]] = []
    if isinstance(obj, (tuple, list)):
        for i, v in enumerate(obj):
            if isinstance(v, torch.Tensor):
                out.append((fast[i] if i < len(fast) else f"{prefix}[{i}]", v))
            elif v is not None and not isinstance(v, _SCALARS):
                out += _named_leaves(v, f"{prefix}[{i}]", ())
    elif isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, torch.Tensor):
                out.append((f"{prefix}[{k!r}]", v))
            elif v is not None and not isinstance(v, _SCALARS):
                out += _named_leaves(v, f"{prefix}[{k!r}]", ())
    elif type(obj) in pytree.SUPPORTED_NODES:
        leaves, _ = pytree.tree_flatten_with_path(obj)
        out = [(prefix + pytree.keystr(p), t) for p, t in leaves if isinstance(t, torch.Tensor)]
    return out


_SCALARS = (int, float, bool, str, bytes)


class Watch:
    """A running overflow watch over one model on this rank; `watch()` makes one.

    Example::

        w = watch(model)
        for batch in loader:
            loss = model(batch).loss
            loss.backward()
            opt.step(); opt.zero_grad()
        w.report().first      # the first non-finite frame, or None
        w.detach()            # every hook gone: the model runs at its own speed again
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        frames: int,
        trace_batches: Iterable[int],
        abort_after: int | None,
        phases: Sequence[str],
        rank: int,
        headroom_warn_bits: float,
        stats: StatsMode,
        step_on: StepOn,
        stop_on_nonfinite: bool,
    ) -> None:
        self.model = model
        self.rank = rank
        self.frames = frames
        self.trace_batches = frozenset(trace_batches)
        self.abort_after = abort_after
        self.phases = tuple(phases)
        self.headroom_warn_bits = headroom_warn_bits
        self.stats: StatsMode = stats
        self.step_on: StepOn = step_on
        self.stop_on_nonfinite = stop_on_nonfinite
        self.readbacks = 0  # host syncs made by this watch: one per step and device
        self._fixed = {"fast": SIGNED, "full": ALL}.get(stats, -1)  # -1: learnt per tensor
        self._step = self._micro = self._order = 0
        self._metas: list[FrameMeta] = []
        self._buf = StepBuffer()
        self._lowp = False  # whether this step saw an fp16/bf16 compute dtype
        self._seen: dict[int, tuple[Any, int, int]] = {}
        self._grad_metas: dict[int, tuple[Any, int, list[tuple[str, str, str]]]] = {}
        self._groups: dict[tuple[str, Phase, str], int] = {}
        self._warned: set[tuple[str, Phase]] = set()
        self._tail: Callable[[], list[Frame]] = list  # the latest frames, built on demand
        self._first: Frame | None = None
        self._ring: tuple[Frame, ...] = ()
        self._traced: list[Frame] = []
        self._headroom: list[Frame] = []
        self._stopped = ""
        self._handles: list[RemovableHandle] = []
        self._tensor_hooks: list[RemovableHandle] = []
        self._names = {m: (p, type(m).__name__) for p, m in model.named_modules()}
        self._fwd = "forward" in self.phases
        self._bwd = "backward" in self.phases
        self._attach()

    # -- public ----------------------------------------------------------------------------

    @property
    def attached(self) -> bool:
        return bool(self._handles)

    def step(self) -> None:
        """End the current step: read its statistics back (one host sync per device).

        With `step_on="explicit"` this is the only place steps end, and every forward of the
        root module in between is a micro-step. It raises `NonFiniteError`/`OverflowStop` when
        the watch was asked to stop.
        """
        if self._handles:
            self._end_step()

    def report(self) -> RankOverflowReport:
        """What this watch saw so far, as a plain record; reads back what is still pending."""
        if self._metas:
            self._readback()  # a stop it asks for is left to the step's end
        return RankOverflowReport(
            rank=self.rank,
            steps=self._step,
            readbacks=self.readbacks,
            first=self._first,
            ring=self._ring or tuple(self._tail()),
            traced=tuple(self._traced),
            headroom=tuple(self._headroom),
            stopped=self._stopped,
            stats=self.stats,
        )

    def detach(self) -> None:
        """Remove every hook this watch installed; the report stays readable."""
        for h in [*self._handles, *self._tensor_hooks]:
            h.remove()
        self._handles.clear()
        self._tensor_hooks.clear()
        self._buf.scratch = Scratch()  # frees the buffers

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def __repr__(self) -> str:
        state = "attached" if self.attached else "detached"
        first = f", first non-finite at {self._first.where}" if self._first else ""
        return (
            f"<Watch rank {self.rank} {state}: {self._step} steps, "
            f"{self.readbacks} readbacks{first}>"
        )

    # -- hooks -------------------------------------------------------------------------------

    def _attach(self) -> None:
        add = self._handles.append
        add(self.model.register_forward_pre_hook(self._on_root_forward))
        if self._fwd or self._bwd:
            for m in self._names:
                add(m.register_forward_hook(self._on_forward, with_kwargs=True))
        if "grad" in self.phases:
            owners: dict[nn.Parameter, tuple[str, str, str]] = {}
            for path, m in self.model.named_modules():
                for name, p in m.named_parameters(recurse=False):
                    owners.setdefault(p, (path, type(m).__name__, f"{name}.grad"))
            for p, meta in owners.items():
                if p.requires_grad:
                    hook = partial(self._on_grad, meta)
                    add(p.register_post_accumulate_grad_hook(hook))  # type: ignore[no-untyped-call]

    def _on_root_forward(self, module: nn.Module, args: Any) -> None:
        if self.step_on == "forward":
            if self._metas:
                self._end_step()
        elif self._order:
            self._micro += 1

    def _on_forward(
        self, module: nn.Module, args: Any, kwargs: dict[str, Any], output: Any
    ) -> None:
        path, cls = self._names.get(module) or ("?", type(module).__name__)
        outs = _named_leaves(output, "output", _OUTPUT)
        cdt = None  # under autocast, the dtype the module computed in: its output's
        for _, t in outs:
            if t.is_floating_point():
                if torch.is_autocast_enabled(t.device.type):
                    cdt = t.dtype
                break
        if self._fwd:
            see = self._see
            with torch.no_grad():  # the statistics must not join the autograd graph
                for name, p in module._parameters.items():
                    if p is not None:
                        see(p, path, cls, FORWARD, name, cdt)
                for name, t in _named_leaves(args, "input", _INPUT):
                    see(t, path, cls, FORWARD, name, cdt)
                if kwargs:
                    for name, t in _named_leaves(kwargs, "input", ()):
                        see(t, path, cls, FORWARD, name, cdt)
                for name, t in outs:
                    see(t, path, cls, FORWARD, name, cdt)
        if self._bwd and torch.is_grad_enabled():
            for name, t in outs:
                if t.requires_grad:
                    self._hook_grad(t, (path, cls, "grad_" + name))

    def _hook_grad(self, t: torch.Tensor, meta: tuple[str, str, str]) -> None:
        # A container's output is often its last child's: one tensor hook serves both frames.
        hit = self._grad_metas.get(id(t))
        if hit is not None and hit[0]() is t and hit[1] == t._version:
            hit[2].append(meta)
            return
        metas = [meta]
        self._grad_metas[id(t)] = (weakref.ref(t), t._version, metas)
        hook = partial(self._on_grad_output, metas)
        self._tensor_hooks.append(t.register_hook(hook))  # type: ignore[no-untyped-call]

    def _on_grad_output(self, metas: list[tuple[str, str, str]], grad: torch.Tensor) -> None:
        if self._handles:  # a tensor hook left on a graph from before detach() does nothing
            with torch.no_grad():  # backward(create_graph=True) would record the statistics
                for path, cls, name in metas:
                    self._see(grad, path, cls, BACKWARD, name, None)

    def _on_grad(self, meta: tuple[str, str, str], param: torch.Tensor) -> None:
        if param.grad is not None:
            with torch.no_grad():
                self._see(param.grad, meta[0], meta[1], GRAD, meta[2], None)

    # -- recording ---------------------------------------------------------------------------

    def _see(self, t: torch.Tensor, path: str, cls: str, phase: Phase, name: str, cdt: Any) -> None:
        if not t.is_floating_point():
            return
        cdt = cdt or t.dtype
        # One tensor is often seen several times (a child's output is the next module's input
        # and its parent's output): compute its statistics once per value.
        version = -1 if t.is_inference() else t._version
        hit = self._seen.get(id(t))
        if hit is not None and hit[0]() is t and hit[1] == version:
            slot = hit[2]
        else:
            if t.layout != torch.strided or t.is_meta or not t.numel():
                return
            key = (path, phase, name)
            groups = self._fixed if self._fixed >= 0 else self._groups.get(key, 0)
            if groups & UNDER:
                groups |= ZEROS  # `under` is non-zero values minus those at least tiny
                if limits(t.dtype).subnormal >= limits(cdt).tiny:
                    groups &= ~UNDER  # t cannot hold a non-zero value under tiny
            slot = self._buf.add(t, groups, cdt, key)
            self._seen[id(t)] = (weakref.ref(t), version, slot)
        if cdt in LOW_PRECISION:
            self._lowp = True
        self._metas.append((self._order, self._micro, path, cls, phase, name, slot, cdt))
        self._order += 1

    # -- step end ----------------------------------------------------------------------------

    def _end_step(self) -> None:
        stop = self._readback() if self._metas else None
        self._step += 1
        self._micro = self._order = 0
        self._seen.clear()
        self._grad_metas.clear()
        self._tensor_hooks.clear()  # their graphs are gone; the hooks check `attached` anyway
        if stop is None and self.abort_after is not None and self._step > self.abort_after:
            stop = ("abort_after", OverflowStop, self._abort_message())
        if stop is not None:
            self._stopped = stop[0]
            self.detach()
            raise stop[1](stop[2], self.report())

    def _readback(self) -> tuple[str, type[OverflowStop], str] | None:
        """Read the pending statistics back and process them; says whether to stop."""
        slots, decoded, syncs = self._buf.read()
        self.readbacks += syncs
        self._seen.clear()  # its slot numbers pointed into the buffer just read
        now = time.time_ns()
        metas, self._metas = self._metas, []
        if self.stats == "auto":
            self._escalate(slots, decoded)
        first_i = self._find_first(metas, decoded) if self._first is None else None
        if self._lowp:
            self._check_headroom(metas, slots, decoded, now)
            self._lowp = False
        frame = partial(self._frame, step=self._step, slots=slots, decoded=decoded, now=now)
        if self._step in self.trace_batches:
            self._traced.extend(frame(m) for m in metas)
        stop = None
        if first_i is not None:
            upto = [frame(m) for m in metas[max(0, first_i + 1 - self.frames) : first_i + 1]]
            self._ring = tuple([*self._tail(), *upto][-self.frames :])
            self._first = first = self._ring[-1]
            if self.stop_on_nonfinite:
                msg = (
                    f"rank {self.rank}: non-finite values at step {first.step}, {first.where}: "
                    f"{first.describe()}. The frames before it: %dist_overflow --report "
                    "(or watch.report().ring)."
                )
                stop = ("nonfinite", NonFiniteError, msg)
        last = metas[-self.frames :]
        self._tail = lambda: [frame(m) for m in last]  # most steps never need their frames
        return stop

    def _escalate(self, slots: list[Slot], decoded: list[Decoded]) -> None:
        """Ask for more statistics, from the next step on, where these left counts open.

        Zeros first get ZEROS (their count and the smallest non-zero |x|); only a smallest
        non-zero |x| under tiny then asks for UNDER, so that fp32 activations with dropout zeros
        do not pay for an underflow count that is provably 0.
        """
        for slot, d in zip(slots, decoded, strict=True):
            if d.under is not None and d.nan is not None and d.zeros is not None:
                continue
            need = 0
            if d.zeros is None:
                need |= ZEROS
            low = d.min_nonzero if d.min_nonzero is not None else (d.abs_min or 0.0)
            if 0 < low < limits(slot.cdtype).tiny:
                need |= UNDER
            if d.nan is None or d.inf is None:
                need |= NONFINITE | ZEROS
            if need & ~slot.groups:
                self._groups[slot.key] = self._groups.get(slot.key, 0) | need

    def _find_first(self, metas: list[FrameMeta], decoded: list[Decoded]) -> int | None:
        if all(d.abs_max < math.inf for d in decoded):
            return None
        return next(i for i, m in enumerate(metas) if not decoded[m[6]].abs_max < math.inf)

    def _check_headroom(
        self, metas: list[FrameMeta], slots: list[Slot], decoded: list[Decoded], now: int
    ) -> None:
        """Warn once per (module, phase), and once per value: a container's output is the same
        tensor as its last child's, and the child that made it is the one to name."""
        done: set[int] = set()
        for m in metas:
            cdt, si = m[7], m[6]
            if cdt not in LOW_PRECISION or si in done:
                continue
            if (m[2], m[4]) in self._warned:
                done.add(si)
                continue
            hi = decoded[si].abs_max
            if 0 < hi < math.inf and math.log2(limits(cdt).max / hi) < self.headroom_warn_bits:
                done.add(si)
                self._warned.add((m[2], m[4]))
                f = self._frame(m, step=self._step, slots=slots, decoded=decoded, now=now)
                self._headroom.append(f)
                warnings.warn(_headroom_message(f, self.rank), DistnbWarning, stacklevel=2)

    def _frame(
        self, m: FrameMeta, *, step: int, slots: list[Slot], decoded: list[Decoded], now: int
    ) -> Frame:
        order, micro, path, cls, phase, name, si, cdt = m
        slot, d = slots[si], decoded[si]
        hi = d.abs_max
        return Frame(
            step=step,
            micro=micro,
            order=order,
            module=path,
            cls=cls,
            phase=phase,
            name=name,
            dtype=_dtype_name(slot.dtype),
            compute_dtype=_dtype_name(cdt),
            numel=slot.numel,
            abs_min=d.abs_min,
            abs_max=hi,
            min_nonzero=d.min_nonzero,
            nan=d.nan,
            inf=d.inf,
            zeros=d.zeros,
            under=d.under if cdt == slot.cdtype else None,  # counted against another tiny
            headroom_bits=math.log2(limits(cdt).max / hi) if 0 < hi < math.inf else None,
            readback_ns=now,
        )

    def _abort_message(self) -> str:
        return (
            f"rank {self.rank}: stopped after step {self.abort_after} as asked "
            f"(abort_after={self.abort_after}); watch.report() has the frames."
        )


def _headroom_message(f: Frame, rank: int) -> str:
    assert f.headroom_bits is not None
    return (
        f"rank {rank}: {f.where} at step {f.step}: |x| max {f.abs_max:.3g} leaves "
        f"{f.headroom_bits:.1f} bits of {f.compute_dtype} headroom (max "
        f"{limits(getattr(torch, f.compute_dtype)).max:.3g}); it overflows if it grows "
        f"{2**f.headroom_bits:.1f}x. Scale the loss down, keep this module in float32, or use "
        "bfloat16."
    )


def watch(
    model: nn.Module,
    *,
    frames: int = 21,
    trace_batches: Iterable[int] = (),
    abort_after: int | None = None,
    phases: Sequence[str] = PHASES,
    rank: int | None = None,
    headroom_warn_bits: float = 4.0,
    stats: StatsMode = "fast",
    step_on: StepOn = "forward",
    stop_on_nonfinite: bool = False,
) -> Watch:
    """Watch `model` for overflow, underflow and non-finite values; returns the running `Watch`.

    - `frames`: how many frames (tensors seen) to keep before the first non-finite one.
    - `trace_batches`: steps whose every frame is kept (`report().traced`).
    - `abort_after`: stop (raise `OverflowStop`, hooks removed) once this step has run.
    - `phases`: any of `"forward"`, `"backward"`, `"grad"`.
    - `rank`: defaults to the process group's rank, else 0.
    - `headroom_warn_bits`: warn (`DistnbWarning`, once per module and phase) when an fp16/bf16
      value is within this many doublings of its dtype's max.
    - `stats`: `"fast"` (default: abs max, NaN/Inf presence, headroom in one pass), `"auto"`
      (also every count it can prove, ~2x the cost) or `"full"` (every count; see the module
      docstring).
    - `step_on`: `"forward"` (each root forward starts a step) or `"explicit"` (`Watch.step()`
      ends steps; root forwards in between are micro-steps).
    - `stop_on_nonfinite`: raise `NonFiniteError` at the first read-back that finds NaN/Inf.

    Example::

        w = watch(model, trace_batches=[0], stop_on_nonfinite=True)
    """
    bad = [p for p in phases if p not in PHASES]
    if bad or not phases:
        raise ConfigError(f"phases must be some of {PHASES}; got {tuple(phases)}")
    if frames < 1:
        raise ConfigError(f"frames must be at least 1; got {frames}")
    if stats not in ("auto", "fast", "full"):
        raise ConfigError(f"stats must be 'auto', 'fast' or 'full'; got {stats!r}")
    if step_on not in ("forward", "explicit"):
        raise ConfigError(f"step_on must be 'forward' or 'explicit'; got {step_on!r}")
    if rank is None:
        dist = torch.distributed
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    return Watch(
        model,
        frames=frames,
        trace_batches=trace_batches,
        abort_after=abort_after,
        phases=phases,
        rank=rank,
        headroom_warn_bits=headroom_warn_bits,
        stats=stats,
        step_on=step_on,
        stop_on_nonfinite=stop_on_nonfinite,
    )


def detect(tensor: torch.Tensor, ctx: str = "") -> bool:
    """True if `tensor` holds a NaN or an Inf (one host sync); warns with the counts if so.

    Example::

        dist.all_reduce(grad)
        detect(grad, "grad after all_reduce")
    """
    x = tensor.detach()
    if not x.is_floating_point() or not x.numel():
        return False
    nan, inf = torch.stack([torch.isnan(x).sum(), torch.isinf(x).sum()]).tolist()
    if nan or inf:
        what = ctx or f"tensor of shape {tuple(x.shape)}"
        warnings.warn(
            f"{what}: {nan} NaN, {inf} Inf of {x.numel()} values", DistnbWarning, stacklevel=2
        )
    return bool(nan or inf)


# -- per-process registry, for the %dist_overflow magic -----------------------------------------

_watches: dict[str, Watch] = {}


def attach(name: str, model: nn.Module, **options: Any) -> Watch:
    """Watch `model` under `name` in this process, replacing an earlier watch of that name."""
    detach(name)
    _watches[name] = w = watch(model, **options)
    return w


def detach(name: str) -> bool:
    """Remove the watch registered under `name`; False if there was none."""
    w = _watches.pop(name, None)
    if w is not None:
        w.detach()
    return w is not None


def attached() -> dict[str, Watch]:
    """The watches registered in this process, by name."""
    return dict(_watches)
