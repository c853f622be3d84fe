"""One JSON codec for every record: `encode(record)` to a dict, `decode(cls, data)` back.

Driven by each dataclass's fields and type hints, so records need no hand-written converters.
Handled: int, float, str, bool, `X | None`, `tuple[X, ...]`, fixed `tuple[X, Y]`,
`Mapping`/`dict[K, V]`, nested records, `Enum` subclasses (by value) and `Any` (passed through).

- JSON object keys are strings: mapping keys are written with `str()` and read back through the
  key's hint (`dict[int, str]` gets its int keys back).
- Float fields write NaN and infinities as "nan", "inf", "-inf" (which `float()` reads back),
  because JSON has none and the output must pass `json.dumps(..., allow_nan=False)`.
- A key missing from `data` takes the field's default, so older payloads still decode.
- Records in a union (`TensorMeta | ModuleMeta`) are told apart by the `kind: ClassVar[str]` each
  of them declares; `encode` writes it as the first key.
- A group's members (`Ranks`) are written as runs, `[[first, last], ...]`: every record of a
  collective names its group's members, and at N ranks a list of N numbers in each made what
  an attached job's verdict moves and decodes grow as N x N. Records decoded from one payload
  share one tuple per group; a plain list of ranks (an older writer's) reads back too.

Example::

    data = encode(CallSite("train.py", 3))  # {"file": "train.py", "line": 3, "cell": None, ...}
    decode(CallSite, data) == CallSite("train.py", 3)
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
from collections.abc import Callable, Iterable, Mapping
from enum import Enum
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    ClassVar,
    TypeVar,
    Union,
    cast,
    get_args,
    get_origin,
    get_type_hints,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["Ranks", "Record", "decode", "dumps_many", "encode", "loads_many"]

R = TypeVar("R", bound="DataclassInstance")
Convert = Callable[[Any], Any]

TAG = "kind"
_UNIONS: tuple[Any, ...] = (Union, types.UnionType)
_MAPPINGS: tuple[Any, ...] = (dict, Mapping)
_SCALARS: tuple[Any, ...] = (int, str, bool)
_RANKS = "ranks"
Ranks = Annotated[tuple[int, ...], _RANKS]  # a group's members, in group-rank order


@dataclasses.dataclass(frozen=True, slots=True)
class _Plan:
    """How to convert one record class: its union tag and, per field, the converters."""

    tag: str | None
    fields: tuple[tuple[str, Convert, Convert, bool], ...]  # name, out, in, required


@functools.cache
def _plan(cls: type) -> _Plan:
    # Type hints are resolved, and converters built, once a class: records cross processes
    # once per collective, so the per-value work must stay a few plain calls.
    hints = get_type_hints(cls, include_extras=True)
    missing = dataclasses.MISSING
    return _Plan(
        tag=getattr(cls, TAG) if get_origin(hints.get(TAG)) is ClassVar else None,
        fields=tuple(
            (
                f.name,
                _encoder(hints[f.name]),
                _decoder(hints[f.name]),
                f.default is missing and f.default_factory is missing,
            )
            for f in dataclasses.fields(cls)
        ),
    )


def encode(record: DataclassInstance) -> dict[str, Any]:
    """`record` as a dict that `json.dumps(..., allow_nan=False)` accepts."""
    plan = _plan(type(record))
    out: dict[str, Any] = {} if plan.tag is None else {TAG: plan.tag}
    for name, to_json, _, _ in plan.fields:
        out[name] = to_json(getattr(record, name))
    return out


def decode(cls: type[R], data: Mapping[str, Any]) -> R:
    """Rebuild a `cls` from `encode`'s output (or its JSON round trip); unknown keys are ignored."""
    fields = _plan(cls).fields
    try:  # every key there and every value good, as `encode` writes them: one pass
        return cls(**{name: from_json(data[name]) for name, _, from_json, _ in fields})
    except (KeyError, TypeError, ValueError):
        pass  # a key left out (an older writer's) takes its default; a bad value is named
    kwargs: dict[str, Any] = {}
    for name, _, from_json, required in fields:
        if name not in data:
            if required:
                raise ValueError(f"{cls.__name__} needs {name!r}; found keys {sorted(data)}")
            continue  # the dataclass fills in the default
        try:
            kwargs[name] = from_json(data[name])
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{cls.__name__}.{name}: {exc}") from exc
    return cls(**kwargs)


def _same(value: Any) -> Any:
    return value


def _float_out(value: float) -> float | str:
    return value if math.isfinite(value) else str(float(value))  # "nan", "inf", "-inf"


@functools.cache
def _encoder(hint: Any) -> Convert:
    origin, args = get_origin(hint), get_args(hint)
    if origin is Annotated:
        return _runs_out if _RANKS in hint.__metadata__ else _encoder(args[0])
    if hint is Any or hint in _SCALARS:
        return _same
    if hint is float:
        return _float_out
    if origin in _UNIONS:
        members = [a for a in args if a is not type(None)]
        one = _encoder(members[0]) if len(members) == 1 else None
        if one is not None:
            return lambda v: None if v is None else one(v)
        return lambda v: None if v is None else _encoder(_member_of(members, v))(v)
    if origin is tuple and args[-1:] == (Ellipsis,):
        item = _encoder(args[0])
        return lambda v: [item(x) for x in v]
    if origin is tuple:
        items = [_encoder(a) for a in args]
        return lambda v: [f(x) for f, x in zip(items, v, strict=True)]
    if origin in _MAPPINGS:
        key, val = _encoder(args[0]), _encoder(args[1])
        return lambda v: {str(key(k)): val(x) for k, x in v.items()}
    if isinstance(hint, type) and issubclass(hint, Enum):
        return lambda v: v.value
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return encode
    raise TypeError(f"the record codec cannot encode {hint!r}")


@functools.cache
def _decoder(hint: Any) -> Convert:
    origin, args = get_origin(hint), get_args(hint)
    if origin is Annotated:
        return _runs_in if _RANKS in hint.__metadata__ else _decoder(args[0])
    if hint is Any:
        return _same
    if origin in _UNIONS:
        members = [a for a in args if a is not type(None)]
        some = _decoder(members[0]) if len(members) == 1 else _tagged(members)
        return lambda d: None if d is None else some(d)
    if origin is tuple and args[-1:] == (Ellipsis,):
        item = _decoder(args[0])
        return lambda d: tuple([item(x) for x in _not_null(hint, d)])
    if origin is tuple:
        items = [_decoder(a) for a in args]
        return lambda d: tuple(f(x) for f, x in zip(items, _not_null(hint, d), strict=True))
    if origin in _MAPPINGS:
        key, val = _decoder(args[0]), _decoder(args[1])
        return lambda d: {key(k): val(x) for k, x in _not_null(hint, d).items()}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        record = hint
        return lambda d: decode(record, _not_null(hint, d))
    if hint in (*_SCALARS, float) or (isinstance(hint, type) and issubclass(hint, Enum)):
        # float() reads back "nan", "inf" and "-inf"; an Enum is built from its value
        return lambda d: d if type(d) is hint else hint(_not_null(hint, d))
    raise TypeError(f"the record codec cannot decode {hint!r}")


_written: dict[int, tuple[tuple[int, ...], list[list[int]]]] = {}  # id -> (members, runs)


def _runs_out(ranks: tuple[int, ...]) -> list[list[int]]:
    """`ranks` as runs of consecutive ranks, `[[first, last], ...]`. A rank's records share
    their group's tuple: each is cut into runs once (held here, so its id stays its own)."""
    found = _written.get(id(ranks))
    if found is not None and found[0] is ranks:
        return found[1]
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    if len(_written) >= 64:
        _written.clear()
    _written[id(ranks)] = (ranks, runs)
    return runs


def _runs_in(data: Any) -> tuple[int, ...]:
    items = _not_null(Ranks, data)
    if not items or not isinstance(items[0], list):
        return tuple(int(r) for r in items)  # a plain list of ranks
    return _from_runs(tuple((int(a), int(b)) for a, b in items))


@functools.lru_cache(maxsize=256)
def _from_runs(runs: tuple[tuple[int, int], ...]) -> tuple[int, ...]:
    return tuple(r for first, last in runs for r in range(first, last + 1))


def _not_null(hint: Any, data: Any) -> Any:
    if data is None:
        raise TypeError(f"found null where {hint!r} is expected")
    return data


def _member_of(members: list[Any], value: Any) -> Any:
    """The union member `value` is an instance of (the first member if none)."""
    return next((a for a in members if isinstance(value, get_origin(a) or a)), members[0])


def _tagged(members: list[Any]) -> Convert:
    """Decode a union of records by the tag (`kind`) each member declares."""
    records = [a for a in members if isinstance(a, type) and dataclasses.is_dataclass(a)]
    by_tag = {_plan(a).tag: _decoder(a) for a in records}

    def pick(data: Any) -> Any:
        tag = data.get(TAG) if isinstance(data, Mapping) else None
        if tag is None or tag not in by_tag:
            expected = ", ".join(repr(t) for t in by_tag if t is not None)
            raise ValueError(f"unknown {TAG} {tag!r} for {members!r}; expected one of {expected}")
        return by_tag[tag](data)

    return pick


T = TypeVar("T", bound="Record")


class Record:
    """Base of distnb's records: `to_dict()` and `from_dict(data)` through this codec.

    Subclasses are frozen, slotted dataclasses; this base has no fields and no slots of its own.
    """

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        return encode(cast("DataclassInstance", self))

    @classmethod
    def from_dict(cls: type[T], d: Mapping[str, Any]) -> T:
        return cast(T, decode(cast("type[DataclassInstance]", cls), d))


def dumps_many(records: Iterable[DataclassInstance]) -> bytes:
    """Records as one JSON list, for a store value or a board's payload."""
    return json.dumps([encode(r) for r in records]).encode()


def loads_many(cls: type[R], payload: bytes) -> list[R]:
    """The records `dumps_many` wrote."""
    return [decode(cls, d) for d in json.loads(payload)]
