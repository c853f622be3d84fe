"""torch's global switches a script may flip, as the join had them during a run and as the
cells had them after it: default dtype and device, intra-op threads, deterministic algorithms,
grad and anomaly mode, `warn_always`, matmul precision and TF32, cuDNN and oneDNN flags, the
SDPA backends, print options.

TF32 has two APIs in torch 2.13, and they are entangled: the old flags (`allow_tf32`,
`set_float32_matmul_precision`) write the new per-backend `fp32_precision` values, and once a
script has set a new one, reading an old flag raises ("you have used mix of the legacy and new
APIs"). So the old matmul precision is set back first (it writes the new values), then the
new values (the whole state is in them), then the other old flags that can be read and still
differ. `cuda.matmul.allow_tf32` is left to its new value where torch has one: reading it costs
~0.5 ms (it warns that it is deprecated).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["SwitchesPart"]

# (name, getter, setter) of each global switch
Switch = tuple[str, Callable[[], Any], Callable[[Any], object]]
_UNREADABLE = object()  # a value torch refuses to read (an old TF32 flag after the new API)


def _attribute(path: str, name: str) -> Switch:
    def owner() -> Any:
        obj: Any = torch
        for part in path.split(".")[1:]:
            obj = getattr(obj, part)
        return obj

    def put(value: Any) -> None:
        setattr(owner(), name, value)

    return f"{path}.{name}", (lambda: getattr(owner(), name)), put


def _default_device() -> Any:
    """The device `torch.set_default_device` set (None: none, tensors are made on the CPU)."""
    context = getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)
    return getattr(context, "device", None)


def _anomaly() -> tuple[bool, bool]:
    return torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()


# the new TF32 API, the whole before its parts (setting the whole sets every part)
_PRECISIONS = (
    "torch.backends",
    "torch.backends.cuda.matmul",
    "torch.backends.cudnn",
    "torch.backends.cudnn.conv",
    "torch.backends.cudnn.rnn",
    "torch.backends.mkldnn",
    "torch.backends.mkldnn.matmul",
    "torch.backends.mkldnn.conv",
    "torch.backends.mkldnn.rnn",
)
_FLAGS = (
    ("torch.backends.cuda.matmul", "allow_fp16_reduced_precision_reduction"),
    ("torch.backends.cuda.matmul", "allow_bf16_reduced_precision_reduction"),
    ("torch.backends.cudnn", "enabled"),
    ("torch.backends.cudnn", "benchmark"),
    ("torch.backends.cudnn", "deterministic"),
    ("torch.backends.cudnn", "allow_tf32"),
    ("torch.backends.mkldnn", "enabled"),
)
_SDPA = ("flash", "mem_efficient", "math", "cudnn")


def _switches() -> list[Switch]:
    # the old matmul precision first: setting it writes the new values, set back after it
    precisions = [_attribute(path, "fp32_precision") for path in _PRECISIONS]
    matmul = torch.get_float32_matmul_precision, torch.set_float32_matmul_precision
    switches: list[Switch] = [("matmul precision", *matmul), *precisions]
    if not _readable(precisions[1][1]):  # a torch without the new API: the old flag holds it
        switches.append(_attribute("torch.backends.cuda.matmul", "allow_tf32"))
    switches += [
        ("default dtype", torch.get_default_dtype, torch.set_default_dtype),
        ("default device", _default_device, torch.set_default_device),
        ("threads", torch.get_num_threads, torch.set_num_threads),
        ("deterministic", torch.get_deterministic_debug_mode, torch.set_deterministic_debug_mode),
        ("grad mode", torch.is_grad_enabled, torch.set_grad_enabled),
        ("anomaly mode", _anomaly, lambda v: torch.autograd.set_detect_anomaly(*v)),
        ("warn always", torch.is_warn_always_enabled, torch.set_warn_always),
    ]
    switches += [_attribute(path, name) for path, name in _FLAGS]
    cuda = torch.backends.cuda
    for kind in _SDPA:
        get = getattr(cuda, f"{kind}_sdp_enabled", None)
        put = getattr(cuda, f"enable_{kind}_sdp", None)
        if get is not None and put is not None:
            switches.append((f"{kind} SDPA", get, put))
    return switches


class SwitchesPart:
    """torch's global switches and print options (the ones this torch has)."""

    name = "torch switches"

    def __init__(self) -> None:
        self._switches = [s for s in _switches() if _readable(s[1])]

    def capture(self) -> tuple[dict[str, Any], dict[str, Any]]:
        values = {name: _read(get) for name, get, _ in self._switches}
        return values, dict(vars(torch._tensor_str.PRINT_OPTS))

    def fresh(self, joined: tuple[dict[str, Any], dict[str, Any]]) -> None:
        self.restore(joined)

    def restore(self, saved: tuple[dict[str, Any], dict[str, Any]]) -> None:
        values, printing = saved
        failed = []
        for name, get, put in self._switches:
            value = values.get(name, _UNREADABLE)
            if value is _UNREADABLE or _read(get) == value:
                continue
            try:
                put(value)
            except (RuntimeError, TypeError, ValueError) as exc:
                failed.append(f"{name} ({exc})")
        vars(torch._tensor_str.PRINT_OPTS).update(printing)
        if failed:
            raise RuntimeError("could not set back " + "; ".join(failed))


def _read(get: Callable[[], Any]) -> Any:
    try:
        return get()
    except RuntimeError:
        return _UNREADABLE


def _readable(get: Callable[[], Any]) -> bool:
    try:
        get()
    except (AttributeError, RuntimeError, TypeError):
        return False
    return True
