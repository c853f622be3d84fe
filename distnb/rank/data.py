"""Values in and out of a rank's namespace: the rank's half of `Session.pull` and `push`.

`pull_value` looks a name up, brings its tensors to the CPU (a view of a larger tensor is copied,
since pickling a view sends its whole storage), checks the size limit on the tensors' bytes
before pickling anything, then pickles it once. What it cannot send comes back as a `Refusal`.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Mapping
from typing import Any

import torch

from distnb.records.transfer import Reason, Refusal

__all__ = ["assign", "describe", "pull_value", "to_cpu"]

# How deep to look for tensors inside lists, tuples and dicts.
MAX_DEPTH = 8


def pull_value(
    path: str, limit: int, names: Mapping[str, Any] | None = None
) -> tuple[str, bytes] | Refusal:
    """(what it is, its pickle) of the value at `path` (`losses`, `model.weight`) in `names`
    (default: the rank's namespace), or why not."""
    try:
        value = to_cpu(_resolve(path, _namespace() if names is None else names))
    except (KeyError, AttributeError) as exc:
        return Refusal(path, Reason.MISSING, detail=_missing(exc))
    what = describe(value)
    size = _tensor_bytes(value)
    if size > limit:  # known without pickling gigabytes first
        return Refusal(path, Reason.TOO_LARGE, what, size)
    try:
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        return Refusal(path, Reason.UNPICKLABLE, what, detail=f"{type(exc).__name__}: {exc}")
    if len(data) > limit:
        return Refusal(path, Reason.TOO_LARGE, what, len(data))
    return what, data


def assign(names: tuple[str, ...], *values: Any) -> None:
    """Bind each name to its value in this rank's namespace (ipyparallel unpickled them)."""
    _namespace().update(zip(names, values, strict=True))


def to_cpu(value: Any, depth: int = 0) -> Any:
    """`value` with every tensor (also in lists, tuples and dicts) detached, on the CPU, and
    holding only its own elements; the value itself when nothing had to change."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        return tensor.clone() if _storage_bytes(tensor) > _dense_bytes(tensor) else tensor
    if depth >= MAX_DEPTH:
        return value
    if isinstance(value, (list, tuple)):
        items = [to_cpu(v, depth + 1) for v in value]
        if all(a is b for a, b in zip(items, value)):
            return value
        if hasattr(value, "_make"):  # a namedtuple
            return value._make(items)
        return type(value)(items)
    if isinstance(value, dict):
        moved = {k: to_cpu(v, depth + 1) for k, v in value.items()}
        if all(moved[k] is v for k, v in value.items()):
            return value
        result = copy.copy(value)  # keeps OrderedDict, defaultdict
        result.update(moved)
        return result
    return value


def describe(value: Any) -> str:
    """`tensor float32[8, 4]`, `list of 3 items`, or the type's name."""
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        return f"tensor {dtype}[{', '.join(map(str, value.shape))}]"
    kind = type(value)
    if isinstance(value, (list, tuple, dict, set)):
        return f"{kind.__name__} of {len(value)} items"
    return (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )


def _tensor_bytes(value: Any, depth: int = 0) -> int:
    if isinstance(value, torch.Tensor):
        return _storage_bytes(value)
    if depth >= MAX_DEPTH:
        return 0
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return sum(_tensor_bytes(v, depth + 1) for v in value.values())
    return 0


def _storage_bytes(tensor: torch.Tensor) -> int:
    """What pickling the tensor sends: its whole storage (a sparse one: as if dense)."""
    try:
        return int(tensor.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return _dense_bytes(tensor)


def _dense_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _resolve(path: str, names: Mapping[str, Any]) -> Any:
    head, *rest = path.split(".")
    value = names[head]
    for part in rest:
        value = getattr(value, part)
    return value


def _missing(exc: BaseException) -> str:
    """The AttributeError's own words (`'Linear' object has no attribute 'fc'`); a missing
    top-level name needs none."""
    return "" if isinstance(exc, KeyError) else str(exc)


def _namespace() -> dict[str, Any]:
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        raise RuntimeError("distnb.rank.data runs on a rank, inside its IPython engine")
    ns: dict[str, Any] = shell.user_ns
    return ns
