"""Tensors as JupyterLab's Variables panel shows them on a rank: a line, and a clean list.

debugpy shows a tensor by walking its attributes (`H`, `T`, `imag`, ...), some of which raise
for most tensors, and its value only through its repr. The kernel's relay
(`distnb.session.debugger.visual`) asks a stopped rank for these instead, by evaluating a call
in the stopped frame:

- `line(t)`: `float32[16, 3] cpu  tensor([...])` for a small tensor (every value), and
  `float32[1024, 1024] cpu  min -3.1 max 4.2 mean 0.001` for a big one, with the count of NaN
  and Inf values when there are any;
- `fields(t)`: what expanding it shows: shape, dtype, device, requires_grad, grad, the summary
  numbers and the first values, each `[name, value, expression]`.

Both return JSON text (an evaluate's answer is a string's repr). Nothing here changes the
tensor or its autograd graph; a tensor without data (meta, fake) shows its metadata only.
"""

from __future__ import annotations

import json
from typing import Any

import torch

__all__ = ["SMALL", "fields", "head", "line"]

SMALL = 16  # tensors of at most this many elements are shown whole
FIRST = 8  # the values `fields` lists of a big tensor


def head(t: torch.Tensor) -> str:
    """`float32[16, 3] cpu`."""
    dtype = str(t.dtype).removeprefix("torch.")
    return f"{dtype}{list(t.shape)} {t.device}"


def line(t: Any) -> str:
    """The tensor's line in the Variables panel (JSON text of a string)."""
    return json.dumps(_line(t))


def _line(t: Any) -> str:
    if not isinstance(t, torch.Tensor):
        return repr(t)
    if not _has_data(t):
        return head(t)
    if t.numel() <= SMALL:
        return f"{head(t)}  {_one_line(t)}"
    return f"{head(t)}  {_summary(t)}"


def fields(t: Any, name: str) -> str:
    """What expanding the tensor `name` shows (JSON: a list of [name, value, expression])."""
    if not isinstance(t, torch.Tensor):
        return json.dumps([])
    rows: list[list[str]] = [
        ["shape", str(list(t.shape)), f"{name}.shape"],
        ["dtype", str(t.dtype), f"{name}.dtype"],
        ["device", str(t.device), f"{name}.device"],
        ["requires_grad", str(t.requires_grad), f"{name}.requires_grad"],
    ]
    grad = t.grad if t.is_leaf else None
    rows.append(["grad", _line(grad) if grad is not None else "None", f"{name}.grad"])
    if _has_data(t) and t.numel():
        stats = _stats(t)
        rows += [[key, value, name] for key, value in stats.items()]
        first = t.detach().reshape(-1)[:FIRST]
        what = f"first {len(first)}" if t.numel() > len(first) else "values"
        rows.append([what, _one_line(first), f"{name}.reshape(-1)[:{FIRST}]"])
    return json.dumps(rows)


def _has_data(t: torch.Tensor) -> bool:
    return not (t.is_meta or type(t).__name__ == "FakeTensor")


def _one_line(t: torch.Tensor) -> str:
    return " ".join(repr(t.detach()).split())


def _summary(t: torch.Tensor) -> str:
    return " ".join(f"{key} {value}" for key, value in _stats(t).items())


def _stats(t: torch.Tensor) -> dict[str, str]:
    """min, max, mean of the finite values (floating and complex: also NaN and Inf counts)."""
    with torch.no_grad():
        x = t.detach()
        if x.is_complex():
            x = x.abs()
        if x.dtype == torch.bool:
            return {"true": str(int(x.sum().item())), "false": str(int((~x).sum().item()))}
        if not x.is_floating_point():
            return {"min": _num(x.min()), "max": _num(x.max()), "mean": _num(x.double().mean())}
        finite = torch.isfinite(x)
        nan, inf = int(torch.isnan(x).sum().item()), int(torch.isinf(x).sum().item())
        values = x[finite] if nan or inf else x
        stats = {}
        if values.numel():
            values = values.double()
            stats = {"min": _num(values.min()), "max": _num(values.max())}
            stats["mean"] = _num(values.mean())
        if nan:
            stats["NaN"] = str(nan)
        if inf:
            stats["Inf"] = str(inf)
        return stats


def _num(x: torch.Tensor) -> str:
    return f"{x.item():.4g}"
