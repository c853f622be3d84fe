"""The overflow tracer's arithmetic: one tensor's statistics on its device, and their decoding.

`stats_kernel` computes a tensor's statistics as 0-d tensors on its own device (no host sync);
`distnb.rank.overflow.buffer` collects them for a step and reads them back at once; `decode`
turns the floats into counts, filling in every count that the cheap statistics prove.

Statistic groups (bit flags), on top of the base smallest and largest `|x|` (two passes: `abs`
then `aminmax`; with `SIGNED` alone, `aminmax(x)` in one read-only pass instead, which gives the
largest `|x|` but the smallest only when all values share a sign):

- `ZEROS`: the number of non-zero values and the smallest non-zero `|x|` (four passes);
- `UNDER`: how many non-zero values lie under the compute dtype's `tiny` (four passes);
- `NONFINITE`: NaN and Inf counts (seven passes).

What the base statistics prove: smallest `|x|` > 0 means no zeros and that it is the smallest
non-zero `|x|`; smallest `|x|` >= tiny means no underflow; largest `|x|` finite means no NaN and
no Inf (`aminmax` propagates NaN, so a `+inf` maximum also means no NaN).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

__all__ = [
    "ALL",
    "NONFINITE",
    "SIGNED",
    "UNDER",
    "ZEROS",
    "Decoded",
    "Limits",
    "Scratch",
    "decode",
    "decode_signed",
    "limits",
    "stats_kernel",
]

ZEROS = 1
UNDER = 2
NONFINITE = 4
ALL = ZEROS | UNDER | NONFINITE
SIGNED = 8  # alone: the base is `aminmax(x)`, one read-only pass, instead of |x|'s


class Limits(NamedTuple):
    tiny: float  # smallest normal value
    max: float
    subnormal: float  # smallest positive value


_limits: dict[torch.dtype, Limits] = {}


def limits(dtype: torch.dtype) -> Limits:
    """`torch.finfo` figures, cached: the hooks ask per tensor and `finfo()` is not free."""
    lim = _limits.get(dtype)
    if lim is None:
        f = torch.finfo(dtype)
        lim = _limits[dtype] = Limits(f.tiny, f.max, f.smallest_normal * f.eps)
    return lim


class Decoded(NamedTuple):
    """A slot's statistics as Python numbers; None where not measured and not provable."""

    abs_min: float | None
    abs_max: float
    min_nonzero: float | None
    nan: int | None
    inf: int | None
    zeros: int | None
    under: int | None


def stats_kernel(
    x: torch.Tensor,
    groups: int,
    tiny: float,
    scratch: Sequence[torch.Tensor] = (),
    fmax_t: torch.Tensor | None = None,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[list[Any], list[Any]]:
    """Statistics of `x` as 0-d tensors on its device: (values in x's dtype, float32 counts).

    Only float arithmetic and reductions: on CPU they are several times faster than comparisons
    (`isnan`, `==`), which produce bool tensors that reduce slowly. `scratch`: two buffers shaped
    like `x` for the temporaries (see `Scratch`); without them each temporary is allocated.
    `fmax_t`: a 0-d tensor holding the dtype's max on x's device (made here if not given).
    `out`: two 0-d tensors to write the smallest and largest `|x|` into.
    """
    a_out, t_out = (scratch[0], scratch[1]) if scratch else (None, None)
    a = torch.abs(x, out=a_out)
    lo, hi = torch.aminmax(a) if out is None else torch.aminmax(a, out=out)
    values: list[Any] = [lo, hi]
    if not groups:
        return values, []
    counts: list[Any] = []
    fmax = limits(x.dtype).max
    if groups & ZEROS:
        s = torch.sign(a, out=t_out)  # 0 for zeros, 1 for other values (Inf too), NaN for NaN
        counts.append(torch.nansum(s, dtype=torch.float32))  # non-zero, non-NaN values
        # Smallest non-zero |x| without a bool mask: lerp(fmax, |x|, s) is fmax where s is 0
        # and exactly |x| where s is 1 (torch computes end - (end - start) * (1 - w) for w >= .5).
        if fmax_t is None:
            fmax_t = torch.full((), fmax, dtype=x.dtype, device=x.device)
        u = torch.lerp(fmax_t, a, s, out=s)
        if groups & NONFINITE:
            u.nan_to_num_(nan=fmax)  # lerp gives NaN for Inf: skip them too
        values.append(torch.amin(u))
    if groups & UNDER:
        # |x| / tiny clamped to 1 and floored: 0 under tiny, 1 at or above (Inf too), NaN stays.
        v = torch.mul(a, 1.0 / tiny, out=t_out).clamp_(max=1.0).floor_()
        counts.append(torch.nansum(v, dtype=torch.float32))
    if groups & NONFINITE:
        # x * 0 is NaN exactly where x is NaN or +-Inf; clamping first turns Inf into fmax.
        bad = torch.mul(a, 0.0, out=t_out).nan_to_num_(nan=1.0)
        counts.append(torch.sum(bad, dtype=torch.float32))
        nan = torch.clamp(a, max=fmax, out=t_out).mul_(0.0).nan_to_num_(nan=1.0)
        counts.append(torch.sum(nan, dtype=torch.float32))
    return values, counts


def decode(
    numel: int, groups: int, tiny: float, fmax: float, v: Sequence[float], c: Sequence[float]
) -> Decoded:
    """Turn one slot's read-back floats into numbers (see the module docstring for the proofs).

    `v`: `stats_kernel`'s values; `c`: its counts; `tiny`: the compute dtype's; `fmax`: the
    tensor dtype's max.
    """
    lo, hi = v[0], v[1]
    if not groups and lo > 0 and hi < math.inf:  # the common case, for every tensor and step
        return Decoded(lo, hi, lo, 0, 0, 0, 0 if lo >= tiny else None)
    if groups == SIGNED:
        return decode_signed(lo, hi, tiny, numel)
    nan = inf = zeros = under = nonzero = None
    min_nz: float | None = lo if lo > 0 else None
    ci = 0
    if groups & ZEROS:
        nonzero = round(c[0])
        ci = 1
        # v[2] is fmax when nothing but zeros (and Inf) is there, NaN when a NaN is.
        if min_nz is None and nonzero and v[2] < fmax:
            min_nz = v[2]
    if groups & UNDER:
        under = None if nonzero is None else nonzero - round(c[ci])
        ci += 1
    if groups & NONFINITE:
        bad, nan = round(c[ci]), round(c[ci + 1])
        inf = bad - nan
    elif math.isfinite(hi):
        nan = inf = 0
    elif hi > 0:  # +Inf is the max, so no NaN
        nan = 0
    if nonzero is not None and nan is not None:
        zeros = numel - nonzero - nan
    elif lo > 0:
        zeros = 0
    if under is None and min_nz is not None and min_nz >= tiny:
        under = 0
    return Decoded(lo, hi, min_nz, nan, inf, zeros, under)


def decode_signed(lo: float, hi: float, tiny: float, numel: int) -> Decoded:
    """From the signed min and max alone: |x| max, and |x| min only when the signs agree.

    `aminmax` propagates NaN, so finite (or infinite) bounds mean no NaN; the Inf count is known
    when there is none, or when the smallest |x| is Inf itself (every value is).
    """
    if math.isnan(lo) or math.isnan(hi):
        return Decoded(math.nan, math.nan, None, None, None, None, None)
    amax = max(-lo, hi)
    amin = lo if lo >= 0 else (-hi if hi <= 0 else None)
    nan, inf = (0, 0) if amax < math.inf else (0, numel if amin == math.inf else None)
    if amin is None or amin == 0:
        return Decoded(amin, amax, None, nan, inf, None, None)
    return Decoded(amin, amax, amin, nan, inf, 0, 0 if amin >= tiny else None)


class Scratch:
    """Reused buffers for the kernel's temporaries, on CPU only.

    A fresh CPU tensor of 128 KiB or more comes from `mmap` and is paid for again in page faults
    each time; reusing two buffers cut the tracer's cost on an MLP by a third. Small tensors come
    from malloc's free lists, faster than carving a view; CUDA's caching allocator already reuses
    memory, so there the kernel allocates as usual.
    """

    SMALL, LIMIT = 1 << 17, 1 << 28  # bytes: glibc's mmap threshold; a cap on what is held

    def __init__(self) -> None:
        self.buffers: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    def first(self, x: torch.Tensor) -> torch.Tensor | None:
        """One buffer shaped like `x`, or None where `x` should allocate its own."""
        bufs = self.get(x)
        return bufs[0] if bufs else None

    def get(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Two buffers shaped like `x`, or none where `x` should allocate its own."""
        n = x.numel()
        if x.device.type != "cpu" or not self.SMALL <= n * x.element_size() <= self.LIMIT:
            return ()
        if not x.is_contiguous():
            return ()
        bufs = self.buffers.get(x.dtype)
        if bufs is None or bufs[0].numel() < n:
            size = 1 << (n - 1).bit_length()
            bufs = (torch.empty(size, dtype=x.dtype), torch.empty(size, dtype=x.dtype))
            self.buffers[x.dtype] = bufs
        shape, stride = x.shape, x.stride()
        return (bufs[0].as_strided(shape, stride), bufs[1].as_strided(shape, stride))
