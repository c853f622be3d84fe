"""A step's statistics: queued on their devices as they are computed, read back at once.

`StepBuffer.add` computes one tensor's statistics (`stats_kernel`, or a single `aminmax` for the
`fast` mode) on its device and keeps them there, by (dtype, device), so that one `.tolist()` per
device reads the whole step back. `Readout` holds the floats and decodes a slot only when asked:
most steps only need to know that every value was finite, which one sum over the floats tells.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from distnb.rank.overflow.stats import (
    NONFINITE,
    SIGNED,
    UNDER,
    ZEROS,
    Decoded,
    Scratch,
    decode,
    decode_signed,
    limits,
    stats_kernel,
)

__all__ = ["LOW_PRECISION", "Lane", "Readout", "Slot", "StepBuffer"]

LOW_PRECISION = frozenset((torch.float16, torch.bfloat16))

_new_slot = tuple.__new__  # a NamedTuple's own __new__ is Python code, 2x slower: hot path
_STRIDED = torch.strided


class Lane:
    """One (dtype, device)'s smallest and largest `|x|` (signed, under `fast`) for a step.

    Two cells a tensor in one preallocated buffer that `aminmax(out=...)` writes into, through
    views made once: 0-d results kept in a list would each cost an allocation and, at readback, a
    `stack` of them (measured on CPU at 1,024 values a tensor: half of the per-tensor cost).
    `minnz` holds the `ZEROS` statistics' smallest non-zero `|x|`, as 0-d tensors.
    """

    def __init__(self, dtype: torch.dtype, device: torch.device) -> None:
        self.dtype, self.device = dtype, device
        self.cpu = device.type == "cpu"
        self.n = 0  # tensors this step
        self.buf = torch.empty(0, 2, dtype=dtype, device=device)
        self.flat = self.buf.view(-1)
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._used = self.flat  # the cells of the last `used()`
        self.minnz: list[torch.Tensor] = []

    def next_pair(self) -> tuple[int, tuple[torch.Tensor, torch.Tensor]]:
        """The next tensor's position and its two cells."""
        n = self.n
        if n == len(self.pairs):
            self.grow()
        self.n = n + 1
        return n, self.pairs[n]

    def used(self) -> torch.Tensor:
        """This step's cells, flat. The view is kept: steps see as many tensors as the one
        before, and a view made at the readback, after a step's work has taken the CPU's
        caches, costs several microseconds (measured: 7 us, against 1.3 us in a tight loop)."""
        if self._used.numel() != 2 * self.n or self._used.data_ptr() != self.flat.data_ptr():
            self._used = self.flat[: 2 * self.n]
        return self._used

    def grow(self) -> None:
        """Make room for more tensors, keeping this step's statistics."""
        # Only the first steps grow a lane: later steps see the same tensors again.
        size = max(64, 2 * len(self.pairs))
        buf = torch.empty(size, 2, dtype=self.dtype, device=self.device)
        buf[: self.n].copy_(self.buf[: self.n])
        self.buf = buf
        self.flat = buf.view(-1)
        self.pairs = [(row[0], row[1]) for row in buf.unbind()]


class Slot(NamedTuple):
    """One tensor's statistics in a `StepBuffer`: where its scalars sit and how to decode them."""

    numel: int
    cdtype: torch.dtype  # the compute dtype of the frame that computed it
    groups: int
    key: Any  # (module path, phase, tensor name) of the frame that computed it, under `auto`
    lane: Lane
    pos: int  # its row in the lane
    mpos: int  # its smallest non-zero |x| in `lane.minnz`; -1: none
    cpos: int  # its first count in its device's counts; -1: none

    @property
    def dtype(self) -> torch.dtype:
        return self.lane.dtype


class StepBuffer:
    """A step's statistics, still on their devices; `read()` makes one host sync per device."""

    def __init__(self) -> None:
        self.lanes: dict[tuple[torch.dtype, torch.device], Lane] = {}
        self.cpu: dict[torch.dtype, Lane] = {}  # the CPU lanes again, by dtype
        self.counts: dict[torch.device, list[torch.Tensor]] = {}
        self.slots: list[Slot] = []
        self.scratch = Scratch()
        self.fmax: dict[Lane, torch.Tensor] = {}

    def add_signed(self, x: torch.Tensor, cdtype: torch.dtype | None, *where: object) -> int:
        """Queue `x`'s signed min and max (`fast`), computed in `cdtype` (None: x's own dtype);
        returns its slot number, -1 for a tensor without statistics (not floating point, empty,
        sparse, meta). No host sync. Call under no_grad. `where` (the frame's module, phase and
        name) is ignored: the watch calls this in place of its `_record_any`, one call less."""
        numel = x.numel()
        # The hot path, for every tensor of every step: a dense CPU tensor finds its lane by
        # dtype alone (`x.device` builds a new object each time).
        lane = self.cpu.get(x.dtype) if x.is_cpu else None
        if lane is None or x.layout is not _STRIDED:
            if not numel or not x.is_floating_point() or x.layout != _STRIDED or x.is_meta:
                return -1
            lane = self.lanes.get((x.dtype, x.device)) or self._lane(x)
        elif not numel:
            return -1
        pos = lane.n
        if pos == len(lane.pairs):
            lane.grow()
        lane.n = pos + 1
        # One `aminmax`. `amin` + `amax` measured faster on one CPU this project ran on, for
        # float32 of 32 Ki-512 Ki values (6.6 / 5.7 us at 32 Ki), slower on another (an AMD EPYC:
        # 5.2 / 7.1 us), and slower everywhere at 4 Ki and 1 Mi and for float16 and bfloat16.
        torch.aminmax(x, out=lane.pairs[pos])
        slots = self.slots
        slot = (numel, cdtype or lane.dtype, SIGNED, None, lane, pos, -1, -1)
        slots.append(_new_slot(Slot, slot))
        return len(slots) - 1

    def add(self, x: torch.Tensor, numel: int, groups: int, cdtype: torch.dtype, key: Any) -> int:
        """Queue `x`'s statistics; returns its slot number. No host sync; call under no_grad."""
        if groups == SIGNED:
            return self.add_signed(x, cdtype)
        lane = self.lanes.get((x.dtype, x.device)) or self._lane(x)
        pos, out = lane.next_pair()
        mpos = cpos = -1
        if not groups:
            torch.aminmax(torch.abs(x, out=self.scratch.first(x)), out=out)
        else:
            fmax_t = self.fmax.get(lane)
            if fmax_t is None:
                fmax = limits(x.dtype).max
                fmax_t = self.fmax[lane] = torch.full((), fmax, dtype=x.dtype, device=x.device)
            tiny = limits(cdtype).tiny
            values, counts = stats_kernel(x, groups, tiny, self.scratch.get(x), fmax_t, out)
            if len(values) > 2:
                mpos = len(lane.minnz)
                lane.minnz.append(values[2])
            if counts:
                device_counts = self.counts.setdefault(x.device, [])
                cpos = len(device_counts)
                device_counts += counts
        self.slots.append(Slot(numel, cdtype, groups, key, lane, pos, mpos, cpos))
        return len(self.slots) - 1

    def _lane(self, x: torch.Tensor) -> Lane:
        lane = self.lanes[(x.dtype, x.device)] = Lane(x.dtype, x.device)
        if lane.cpu:
            self.cpu[x.dtype] = lane
        return lane

    @property
    def nbytes(self) -> int:
        """Device memory kept between steps: the lanes, scratch buffers, dtype maxima."""
        held = [lane.buf for lane in self.lanes.values()] + list(self.fmax.values())
        held += [t for pair in self.scratch.buffers.values() for t in pair]
        return sum(t.numel() * t.element_size() for t in held)

    def read(self) -> tuple[Readout, int]:
        """(the step's statistics as Python floats, host syncs made) and start afresh."""
        active = [lane for lane in self.lanes.values() if lane.n]
        if len(active) == 1 and not active[0].minnz and not self.counts:  # one dtype, `fast`
            lane = active[0]
            readout = Readout(self.slots, {lane: lane.used().tolist()}, {}, {})
            syncs = 1
        else:
            readout, syncs = self._read(active)
        for lane in active:
            lane.n = 0
            lane.minnz = []
        self.slots, self.counts = [], {}
        return readout, syncs

    def _read(self, active: list[Lane]) -> tuple[Readout, int]:
        values: dict[Lane, list[float]] = {}
        minnz: dict[Lane, list[float]] = {}
        counts: dict[torch.device, list[float]] = {}
        syncs = 0
        for device in {lane.device for lane in active}:
            lanes = [lane for lane in active if lane.device == device]
            parts = [lane.used() for lane in lanes]
            parts += [torch.stack(lane.minnz) for lane in lanes if lane.minnz]
            if device in self.counts:
                parts.append(torch.stack(self.counts[device]))
            if len(parts) > 1:
                flat = torch.cat([p.to(torch.float64) for p in parts]).tolist()  # the one sync
            else:
                flat = parts[0].tolist()  # the one sync
            syncs += 1
            start = 0
            for lane in lanes:
                end = start + 2 * lane.n
                values[lane], start = flat[start:end], end
            for lane in lanes:
                if lane.minnz:
                    end = start + len(lane.minnz)
                    minnz[lane], start = flat[start:end], end
            if device in self.counts:
                counts[device] = flat[start:]
        return Readout(self.slots, values, minnz, counts), syncs


class Readout:
    """A step's statistics as Python floats, decoded slot by slot when asked."""

    def __init__(
        self,
        slots: list[Slot],
        values: dict[Lane, list[float]],
        minnz: dict[Lane, list[float]],
        counts: dict[torch.device, list[float]],
    ) -> None:
        self.slots = slots
        self.values = values  # per lane: smallest, largest, two cells a slot
        self.minnz = minnz
        self.counts = counts
        self._decoded: dict[int, Decoded] = {}
        self.low_precision = False
        for lane in values:
            if lane.dtype in LOW_PRECISION:
                self.low_precision = True

    def all_finite(self) -> bool:
        """Whether every statistic is finite: then no tensor of the step held NaN or Inf.

        One sum per lane: the values are at most float32's max (3.4e38), so a sum of finite
        ones stays far below float64's (1.8e308), while a NaN or an Inf carries through.
        """
        return all(math.isfinite(sum(v)) for v in self.values.values())

    def decoded(self, i: int) -> Decoded:
        """Slot `i`'s statistics as numbers (see `distnb.rank.overflow.stats.decode`)."""
        d = self._decoded.get(i)
        if d is None:
            s = self.slots[i]
            lo, hi = self.values[s.lane][2 * s.pos : 2 * s.pos + 2]
            tiny = limits(s.cdtype).tiny
            if s.groups == SIGNED:
                d = decode_signed(lo, hi, tiny, s.numel)
            else:
                v = [lo, hi] if s.mpos < 0 else [lo, hi, self.minnz[s.lane][s.mpos]]
                c = self.counts[s.lane.device][s.cpos : s.cpos + 4] if s.cpos >= 0 else ()
                d = decode(s.numel, s.groups, tiny, limits(s.dtype).max, v, c)
            self._decoded[i] = d
        return d

    def escalations(self) -> dict[Any, int]:
        """For `auto`: per frame key, the statistic groups to ask for from the next step on.

        Zeros first get ZEROS (their count and the smallest non-zero |x|); only a smallest
        non-zero |x| under tiny then asks for UNDER, so that fp32 activations with dropout zeros
        do not pay for an underflow count that is provably 0.
        """
        need: dict[Any, int] = {}
        for i, slot in enumerate(self.slots):
            d = self.decoded(i)
            if d.under is not None and d.nan is not None and d.zeros is not None:
                continue
            groups = 0
            if d.zeros is None:
                groups |= ZEROS
            low = d.min_nonzero if d.min_nonzero is not None else (d.abs_min or 0.0)
            if 0 < low < limits(slot.cdtype).tiny:
                groups |= UNDER
            if d.nan is None or d.inf is None:
                groups |= NONFINITE | ZEROS
            if groups & ~slot.groups:
                need[slot.key] = need.get(slot.key, 0) | groups
        return need
