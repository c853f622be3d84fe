"""From read-back statistics to frames: the first non-finite one, the headroom warnings, traces.

A step's frames are kept as metadata tuples (`FrameMeta`) until they are read back; `History`
turns only the ones it keeps into `Frame` records: the frames up to the first non-finite value,
those of the traced steps, those that warned about headroom, and (built on demand) the last
frames of the latest step.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

from distnb.errors import DistnbWarning
from distnb.rank.overflow.buffer import LOW_PRECISION, Readout
from distnb.rank.overflow.stats import limits
from distnb.records.overflow import Frame, Phase, WatchOptions

__all__ = ["LOW_PRECISION", "FrameMeta", "History", "named_leaves"]

# micro-step, module path, class, phase, tensor name, slot, compute dtype (None: the tensor's)
FrameMeta = tuple[int, str, str, Phase, str, int, "torch.dtype | None"]

_SCALARS = (int, float, bool, str, bytes)


def named_leaves(obj: Any, prefix: str, fast: tuple[str, ...]) -> list[tuple[str, torch.Tensor]]:
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
                out += named_leaves(v, f"{prefix}[{i}]", ())
    elif isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, torch.Tensor):
                out.append((f"{prefix}[{k!r}]", v))
            elif v is not None and not isinstance(v, _SCALARS):
                out += named_leaves(v, f"{prefix}[{k!r}]", ())
    elif type(obj) in pytree.SUPPORTED_NODES:
        leaves, _ = pytree.tree_flatten_with_path(obj)
        out = [(prefix + pytree.keystr(p), t) for p, t in leaves if isinstance(t, torch.Tensor)]
    return out


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def build_frame(m: FrameMeta, order: int, step: int, readout: Readout, now: int) -> Frame:
    """The record of one frame, from its metadata and its slot's statistics."""
    micro, path, cls, phase, name, si, cdt = m
    slot, d = readout.slots[si], readout.decoded(si)
    cdt = cdt or slot.dtype
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


class History:
    """What a watch keeps across steps: the first non-finite frame and the frames before it,
    every frame of the traced steps, the frames that warned about headroom."""

    def __init__(self, rank: int, options: WatchOptions) -> None:
        self.rank = rank
        self.frames = options.frames
        self.trace = frozenset(options.trace_batches)
        self.warn_bits = options.headroom_warn_bits
        self.first: Frame | None = None
        self.ring: tuple[Frame, ...] = ()
        self.traced: list[Frame] = []
        self.headroom: list[Frame] = []
        self._warned: set[tuple[str, Phase]] = set()
        self._latest: Callable[[], list[Frame]] = list  # the latest frames, built on demand

    def tail(self) -> tuple[Frame, ...]:
        """The last frames read back (at most `frames` of them)."""
        return tuple(self._latest())

    def record(
        self, step: int, base: int, metas: list[FrameMeta], readout: Readout, lowp: bool
    ) -> Frame | None:
        """Take one read-back's frames (the first has order `base`); returns the first
        non-finite frame if these frames hold the watch's first."""
        now = time.time_ns()

        def frame(i: int) -> Frame:
            return build_frame(metas[i], base + i, step, readout, now)

        found = None
        if self.first is None and not readout.all_finite():
            first_i = _find_first(metas, readout)
            if first_i is not None:
                upto = [frame(i) for i in range(max(0, first_i + 1 - self.frames), first_i + 1)]
                self.ring = tuple([*self._latest(), *upto][-self.frames :])
                self.first = found = self.ring[-1]
        if lowp:
            self._check_headroom(metas, readout, frame)
        if step in self.trace:
            self.traced.extend(frame(i) for i in range(len(metas)))
        last = range(max(0, len(metas) - self.frames), len(metas))
        self._latest = lambda: [frame(i) for i in last]  # most steps never need their frames
        return found

    def _check_headroom(
        self, metas: list[FrameMeta], readout: Readout, frame: Callable[[int], Frame]
    ) -> None:
        """Warn once per (module, phase), and once per value: a container's output is the same
        tensor as its last child's, and the child that made it is the one to name."""
        done: set[int] = set()
        for i, m in enumerate(metas):
            si = m[5]
            cdt = m[6] or readout.slots[si].dtype
            if cdt not in LOW_PRECISION or si in done:
                continue
            if (m[1], m[3]) in self._warned:
                done.add(si)
                continue
            hi = readout.decoded(si).abs_max
            if 0 < hi < math.inf and math.log2(limits(cdt).max / hi) < self.warn_bits:
                done.add(si)
                self._warned.add((m[1], m[3]))
                f = frame(i)
                self.headroom.append(f)
                warnings.warn(_headroom_message(f, self.rank), DistnbWarning, stacklevel=2)


def _find_first(metas: list[FrameMeta], readout: Readout) -> int | None:
    return next(
        (i for i, m in enumerate(metas) if not readout.decoded(m[5]).abs_max < math.inf), None
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
