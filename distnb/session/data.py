"""Values between the kernel and the ranks: `Session.pull` and `Session.push`.

`pull` brings a value from every rank's namespace (tensors on the CPU) into the kernel, one per
rank, in rank order, e.g. to plot each rank's losses with matplotlib. `push` binds kernel values
to names on the ranks. Both refuse values over a size limit (`DEFAULT_LIMIT` per value and rank,
checked before the data moves) and values that do not pickle, naming the value, what it is, its
size, the limit and the fix.
"""

from __future__ import annotations

import keyword
import pickle
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from distnb.errors import ConfigError, RankError
from distnb.ranklist import RankArg, format_ranks
from distnb.records.transfer import Reason, Refusal
from distnb.views._format import format_bytes

if TYPE_CHECKING:
    from distnb.session.surface import SessionSurface

__all__ = [
    "DEFAULT_LIMIT",
    "RESERVED",
    "check_pull",
    "check_push",
    "parse_size",
    "pickled",
    "pull",
    "push",
    "received",
    "refusal_message",
]

DEFAULT_LIMIT = 64 * 2**20
# The rank's own names (distnb binds them at start); pushing over them would lie to user code.
RESERVED = frozenset({"rank", "world_size", "local_rank", "device"})
_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_SIZE = re.compile(r"(\d+(?:\.\d*)?)\s*([kmgt]?)(i?)(b?)", re.IGNORECASE)
_REBUILD_FIX = (
    "a class or function defined in a notebook cell exists only where that cell ran: send plain "
    "values (numbers, lists, dicts, tensors, a state_dict()), or define it on both sides"
)


def pull(
    session: SessionSurface, name: str, ranks: RankArg | None = None, limit: int | None = None
) -> list[Any]:
    """Each rank's `name` (a name or dotted path), in rank order; tensors come on the CPU.

    >>> losses = s.pull("losses")           # %dist_pull losses
    >>> for rank, curve in enumerate(losses):
    ...     plt.plot(curve, label=f"rank {rank}")

    `limit`: the most bytes a rank may send (default 64 MiB). Raises `ConfigError` naming each
    rank that has no such name, holds more than `limit`, or holds something that cannot be
    pickled or rebuilt in the kernel.
    """
    from distnb.rank import data

    limit = check_pull(name, limit)
    answers = session.call(data.pull_value, name, limit, ranks=ranks)
    return received(
        name, limit, zip((i.rank for i in session.targets(ranks)), answers, strict=True)
    )


def check_pull(name: str, limit: int | None) -> int:
    """The limit a pull of `name` goes by; ConfigError for a name that is no dotted path."""
    if not _PATH.fullmatch(name):
        raise ConfigError(
            f"pull takes a name or dotted path, e.g. 'losses' or 'model.fc', got {name!r}"
        )
    return _check_limit(limit)


def received(
    name: str, limit: int, answers: Iterable[tuple[int, tuple[str, bytes] | Refusal]]
) -> list[Any]:
    """The values the ranks sent for `name`, rebuilt, in the answers' order; one ConfigError
    naming every rank that refused, and why."""
    by_rank = list(answers)
    refused = [(rank, a) for rank, a in by_rank if isinstance(a, Refusal)]
    if refused:
        raise ConfigError(refusal_message(refused, limit))
    return [
        _rebuild(rank, name, *answer) for rank, answer in by_rank if not isinstance(answer, Refusal)
    ]


def push(
    session: SessionSurface, ranks: RankArg | None = None, limit: int | None = None, **values: Any
) -> None:
    """Bind each keyword's value to its name on every rank (or the listed ones).

    >>> s.push(lr=0.1, targets=torch.arange(8))   # %dist_push lr targets
    >>> s.run("print(rank, lr)")

    Values are pickled once (functions and classes defined in the notebook are sent by value)
    and must each be at most `limit` bytes (default 64 MiB). `ranks` and `limit` are this
    method's own arguments, so values of those names cannot be pushed this way.
    """
    from distnb.rank import data

    limit = check_push(values, limit)
    packed = {name: _pack(name, value, limit) for name, value in values.items()}
    try:
        session.call(data.assign, tuple(packed), *packed.values(), ranks=ranks)
    except RankError as err:
        failed = "; ".join(f"rank {f.rank}: {f.summary}" for f in err.failures)
        raise ConfigError(
            f"the ranks could not rebuild {', '.join(map(repr, packed))} ({failed}); {_REBUILD_FIX}"
        ) from err


def check_push(values: dict[str, Any], limit: int | None) -> int:
    """The limit a push of `values` goes by; ConfigError for no values, or a name that cannot
    be bound on a rank."""
    if not values:
        raise ConfigError("push needs values to send: s.push(lr=0.1) or %dist_push lr")
    _check_names(values)
    return _check_limit(limit)


def pickled(name: str, value: Any, limit: int) -> bytes:
    """`value` pickled (plain pickle: for ranks that are not ipyparallel's, an attached job's),
    or a ConfigError saying why it cannot go."""
    try:
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise ConfigError(
            f"cannot push {name!r}: it does not pickle ({type(exc).__name__}: {exc}); push a "
            "picklable part of it (numbers, lists, dicts, tensors, arrays)"
        ) from exc
    if len(data) > limit:
        raise ConfigError(
            f"cannot push {name!r}: it is {format_bytes(len(data))} pickled, over the "
            f"{format_bytes(limit)} limit; send less, or raise the limit (--limit 1GiB)"
        )
    return data


def parse_size(text: str) -> int:
    """`64MiB`, `1.5GB`, `2G`, `1000000` -> bytes (`K`, `M`, `G` alone are binary)."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ConfigError(f"a size is a number with a unit, e.g. 256MiB or 2GiB; got {text!r}")
    number, unit, binary, byte = match.groups()
    power = " kmgt".index(unit.lower() or " ")
    base = 1000 if power and byte and not binary else 1024  # MB: 1000**2; M, MiB: 1024**2
    return int(float(number) * base**power)


def refusal_message(refusals: Sequence[tuple[int, Refusal]], limit: int) -> str:
    """The whole message for a pull that ranks refused: one line per reason, with its fix.

    >>> refusal_message([(1, Refusal("h", Reason.TOO_LARGE, "tensor float32[8192, 8192]",
    ...                              2**28))], 2**26)
    "cannot pull 'h': 'h' on rank 1 (tensor float32[8192, 8192]) is 256.0 MiB, over the ..."
    """
    lines = []
    for reason in Reason:
        group = [(rank, r) for rank, r in refusals if r.reason is reason]
        if group:
            lines.append(_refusal_line(reason, group, limit))
    head = f"cannot pull {refusals[0][1].name!r}: "
    return head + lines[0] if len(lines) == 1 else head + "\n" + "\n".join(lines)


def _refusal_line(reason: Reason, group: Sequence[tuple[int, Refusal]], limit: int) -> str:
    first = group[0][1]
    name, ranks = repr(first.name), format_ranks(rank for rank, _ in group)
    if reason is Reason.MISSING:
        verb = "has" if len(group) == 1 else "have"
        detail = f" ({first.detail})" if first.detail else ""
        return f"{ranks} {verb} no {name}{detail}; assign it in an %%allranks cell first"
    if reason is Reason.TOO_LARGE:
        sizes = {r.nbytes for _, r in group}
        size = (
            format_bytes(first.nbytes)
            if len(sizes) == 1
            else ", ".join(f"{format_bytes(r.nbytes)} (rank {rank})" for rank, r in group)
        )
        return (
            f"{name} on {ranks} ({first.what}) is {size}, over the {format_bytes(limit)} limit "
            "per rank; pull less (a slice, a mean, .item(), every 10th value) or raise the "
            f"limit: s.pull({name}, limit=2**30) or %dist_pull {first.name} --limit 1GiB"
        )
    return (
        f"{name} on {ranks} ({first.what}) does not pickle ({first.detail}); assign a "
        "picklable part of it in an %%allranks cell (numbers, lists, dicts, tensors, a "
        "state_dict()) and pull that"
    )


def _rebuild(rank: int, name: str, what: str, data: bytes) -> Any:
    try:
        return pickle.loads(data)
    except Exception as exc:
        raise ConfigError(
            f"cannot pull {name!r}: rank {rank}'s {name!r} ({what}) cannot be rebuilt in the "
            f"kernel ({type(exc).__name__}: {exc}); {_REBUILD_FIX}"
        ) from exc


def _pack(name: str, value: Any, limit: int) -> Any:
    """The value pickled once for every rank (ipyparallel's canning: interactive functions by
    value, large arrays without a copy), or a `ConfigError` saying why it cannot go."""
    from ipyparallel.serialize import PrePickled

    from distnb.rank.data import describe  # the kernel has torch once a session runs

    try:
        packed = PrePickled(value)
    except Exception as exc:
        raise ConfigError(
            f"cannot push {name!r} ({describe(value)}): it does not pickle "
            f"({type(exc).__name__}: {exc}); push a picklable part of it (numbers, lists, dicts, "
            "tensors, arrays)"
        ) from exc
    size = sum(memoryview(b).nbytes for b in packed.buffers)
    if size > limit:
        raise ConfigError(
            f"cannot push {name!r} ({describe(value)}): it is {format_bytes(size)} "
            f"pickled, over the {format_bytes(limit)} limit; send less, or raise the limit: "
            f"s.push({name}=..., limit=2**30) or %dist_push {name} --limit 1GiB"
        )
    return packed


def _check_names(values: dict[str, Any]) -> None:
    bad = [n for n in values if not n.isidentifier() or keyword.iskeyword(n)]
    if bad:
        raise ConfigError(f"push binds Python names; {', '.join(map(repr, bad))} cannot be one")
    taken = sorted(RESERVED.intersection(values))
    if taken:
        raise ConfigError(
            f"{', '.join(taken)} {'is' if len(taken) == 1 else 'are'} the rank's own "
            f"(distnb sets {', '.join(sorted(RESERVED))}); push under another name"
        )


def _check_limit(limit: int | None) -> int:
    if limit is None:
        return DEFAULT_LIMIT
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigError(f"limit is a number of bytes >= 1, e.g. 2**30 for 1 GiB; got {limit!r}")
    return limit
