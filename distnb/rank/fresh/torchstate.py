"""torch's process-wide state a script may change, and the random generators.

Swapped for a run: torch's global switches (default dtype and device, intra-op threads,
deterministic algorithms, grad and anomaly mode, matmul precision and TF32, cuDNN and oneDNN
flags, the SDPA backends, print options, `warn_always`) and the values in torch's config
modules (`torch._dynamo.config`, ...). The random generators get a new seed from the operating
system at the start of a run, as a fresh process does (torch 2.13 seeds its default generator
so too, as do Python's `random` and numpy), and the cells' generators are put back after it, so
a run leaves the cells' random sequence where it was. Process groups a run made and left are
destroyed when it ends, as they end with a torchrun worker.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed.distributed_c10d as c10d

__all__ = ["PARTS"]

# (name, getter, setter) of each global switch
Switch = tuple[str, Callable[[], Any], Callable[[Any], object]]


def _attribute(path: str, name: str) -> tuple[Callable[[], Any], Callable[[Any], object]]:
    def owner() -> Any:
        obj: Any = torch
        for part in path.split(".")[1:]:
            obj = getattr(obj, part)
        return obj

    return (lambda: getattr(owner(), name)), (lambda value: setattr(owner(), name, value))


def _default_device() -> Any:
    """The device `torch.set_default_device` set (None: none, tensors are made on the CPU)."""
    context = getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)
    return getattr(context, "device", None)


def _anomaly() -> tuple[bool, bool]:
    return torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()


_FLAGS = (
    # the new precision settings before the old TF32 flags they stand for
    ("torch.backends", "fp32_precision"),
    ("torch.backends.cuda.matmul", "fp32_precision"),
    ("torch.backends.cudnn", "fp32_precision"),
    ("torch.backends.mkldnn", "fp32_precision"),
    ("torch.backends.cuda.matmul", "allow_tf32"),
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
    switches: list[Switch] = [
        ("default dtype", torch.get_default_dtype, torch.set_default_dtype),
        ("default device", _default_device, torch.set_default_device),
        ("threads", torch.get_num_threads, torch.set_num_threads),
        ("deterministic", torch.get_deterministic_debug_mode, torch.set_deterministic_debug_mode),
        ("grad mode", torch.is_grad_enabled, torch.set_grad_enabled),
        ("anomaly mode", _anomaly, lambda v: torch.autograd.set_detect_anomaly(*v)),
        (
            "matmul precision",
            torch.get_float32_matmul_precision,
            torch.set_float32_matmul_precision,
        ),
        ("warn always", torch.is_warn_always_enabled, torch.set_warn_always),
    ]
    for path, name in _FLAGS:
        switches.append((f"{path}.{name}", *_attribute(path, name)))
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
        self._switches = [s for s in _switches() if _readable(s)]

    def capture(self) -> tuple[dict[str, Any], dict[str, Any]]:
        values = {name: get() for name, get, _ in self._switches}
        return values, dict(vars(torch._tensor_str.PRINT_OPTS))

    def fresh(self, joined: tuple[dict[str, Any], dict[str, Any]]) -> None:
        self.restore(joined)

    def restore(self, saved: tuple[dict[str, Any], dict[str, Any]]) -> None:
        values, printing = saved
        for name, get, put in self._switches:
            if name in values and get() != values[name]:
                put(values[name])
        vars(torch._tensor_str.PRINT_OPTS).update(printing)


def _readable(switch: Switch) -> bool:
    try:
        switch[1]()
    except (AttributeError, RuntimeError, TypeError):
        return False
    return True


class ConfigPart:
    """torch's config modules (`torch._dynamo.config`, `torch._inductor.config`, ...), as far as
    they are loaded: the values that differ are set back."""

    name = "torch config modules"

    def capture(self) -> dict[str, dict[str, Any]]:
        from torch.utils._config_module import ConfigModule

        return {
            name: module.get_config_copy()
            for name, module in list(sys.modules.items())
            if isinstance(module, ConfigModule)
        }

    def fresh(self, joined: dict[str, dict[str, Any]]) -> None:
        self.restore(joined)

    def restore(self, saved: dict[str, dict[str, Any]]) -> None:
        for name, values in saved.items():
            module = sys.modules.get(name)
            if module is None:
                continue
            now = module.get_config_copy()
            for key, value in values.items():
                if key in now and now[key] is not value and now[key] != value:
                    setattr(module, key, value)


class RandomPart:
    """The random generators: seeded anew from the OS for a run, the cells' put back after."""

    name = "random generators"

    def capture(self) -> tuple[Any, Any, Any, Any]:
        initialized = torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
        cuda = torch.cuda.get_rng_state_all() if initialized else None
        return torch.get_rng_state(), cuda, random.getstate(), _numpy_state()

    def fresh(self, joined: tuple[Any, Any, Any, Any]) -> None:
        torch.seed()  # a seed from the OS, on every device
        random.seed()
        numpy = sys.modules.get("numpy.random")
        if numpy is not None:
            numpy.seed()

    def restore(self, saved: tuple[Any, Any, Any, Any]) -> None:
        cpu, cuda, python, numpy = saved
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        random.setstate(python)
        if numpy is not None and "numpy.random" in sys.modules:
            sys.modules["numpy.random"].set_state(numpy)


def _numpy_state() -> Any:
    numpy = sys.modules.get("numpy.random")
    return numpy.get_state() if numpy is not None else None


class GroupsPart:
    """Process groups a run made (`new_group`, a device mesh's) and did not destroy: destroyed
    when it ends. The default group is distnb's (`distnb.rank.world` makes it again if a
    script destroyed it) and the cells' groups stay theirs."""

    name = "process groups"

    def capture(self) -> list[Any]:
        return list(c10d._world.pg_map)

    def fresh(self, joined: list[Any]) -> None:
        """A run starts with the groups there are: the cells' are theirs to keep."""

    def restore(self, saved: list[Any]) -> None:
        kept = {id(pg) for pg in saved}
        default = c10d.GroupMember.WORLD
        for pg in list(c10d._world.pg_map):
            if id(pg) not in kept and pg is not default:
                c10d.destroy_process_group(pg)  # torch's own for a group that is not WORLD


PARTS = (SwitchesPart(), ConfigPart(), RandomPart(), GroupsPart())
