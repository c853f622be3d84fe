"""`detect(tensor)`: whether one tensor holds a NaN or an Inf, asked once, outside any watch."""

from __future__ import annotations

import warnings

import torch

from distnb.errors import DistnbWarning

__all__ = ["detect"]


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
