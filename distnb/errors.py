"""distnb's exceptions, one tree::

    DistnbError
    ├── ConfigError (ValueError)     a bad argument; the message says the fix
    ├── SessionError                 no session, one already running, a cluster that failed to start
    ├── DebuggerQuit                 raised on a rank whose debugger the user quit (`q`, Ctrl-C)
    ├── RankError                    a cell failed on one or more ranks
    │   ├── RankTimeoutError         the cell ran past its timeout; carries the hang report
    │   ├── RankDiedError            a rank's process exited while running a cell
    │   └── CollectiveError          the checked runtime stopped a collective before data moved
    │       ├── CollectiveMismatchError   ranks called incompatible collectives
    │       └── CollectiveDesyncError     a rank never arrived at a collective its peers wait at
    ├── OverflowStop                 the overflow tracer stopped a run as asked (`abort_after`)
    │   └── NonFiniteError           a watched tensor went NaN/Inf under `stop_on_nonfinite`
    └── ReplicasDivergedError        a replica watch with `--raise` saw replicas differ

    CellInterrupted (KeyboardInterrupt)   Ctrl-C stopped a cell; the message says where each
                                          rank was (not a DistnbError: `except Exception`
                                          must not swallow an interrupt)

    DistnbWarning (UserWarning)      raised with `warn`, at the user's line, not distnb's

IPython renders what distnb raises in the kernel as its message, not as a traceback of distnb's
own frames (`_render_traceback_`, which IPython and ipykernel call instead of formatting one):
the message already says what happened, where and what to do. `RankError` renders as its
message and each failing rank's own traceback, with identical errors collapsed
("ranks 0-3: ValueError ...") and at most `TRACEBACK_LIMIT` full tracebacks; every failure stays
on `err.failures`. The same classes are raised on ranks by the checked runtime and re-raised in the
kernel, so `except distnb.errors.CollectiveMismatchError` works on both sides.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from distnb.ranklist import GROUP_FROM, format_ranks, same_ranks
from distnb.records.cell import RankFailure, RankReport

if TYPE_CHECKING:
    from distnb.records.collective import Mismatch
    from distnb.records.overflow import RankOverflowReport

__all__ = [
    "CallInterrupted",
    "CellInterrupted",
    "CollectiveDesyncError",
    "CollectiveError",
    "CollectiveMismatchError",
    "ConfigError",
    "DebuggerQuit",
    "DistnbError",
    "DistnbWarning",
    "Interrupted",
    "NonFiniteError",
    "OverflowStop",
    "RankDiedError",
    "RankError",
    "RankTimeoutError",
    "ReplicasDivergedError",
    "SessionError",
    "warn",
]

TRACEBACK_LIMIT = 4
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # colours in ranks' tracebacks


def _shell_colours() -> bool:
    """Whether the IPython showing a rank's traceback shows colours: the ranks colour theirs,
    which `ipython --colors=NoColor` (or `%colors nocolor`) must not see."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and str(getattr(shell, "colors", "")).lower() != "nocolor"


class DistnbError(Exception):
    """Base of every error distnb raises."""


class _OneMessage:
    """Renders in IPython as `Name: message`, without the kernel's frames (distnb's own)."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


class DistnbWarning(UserWarning):
    """Warnings from distnb (for example fp16 headroom running low)."""


def warn(message: str, category: type[Warning] = DistnbWarning) -> None:
    """`warnings.warn` at the first frame outside distnb and IPython: the user's cell or script
    (`%dist_stop` in cell 7), not the line deep inside distnb that noticed.

    A warning's location is what Python prints before it, and what filters match; a distnb
    line there says nothing to the user. (Python 3.12's `skip_file_prefixes` does the same.)
    """
    level, frame = 2, sys._getframe(1)
    while frame.f_back is not None and _inside(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


T = TypeVar("T")


def warned_at_caller(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)`, for a torch function distnb wraps: a warning it gives with
    `stacklevel` pointing at its caller would point at distnb's wrapper; it is shown at the
    first frame outside distnb (`warn`) instead, where the user called the wrapped function."""
    with warnings.catch_warnings(record=True) as caught:
        result = fn(*args, **kwargs)
    for w in caught:
        if _inside(w.filename):
            warn(w.message, w.category)  # type: ignore[arg-type]
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    return result


def _inside(filename: str) -> bool:
    """Whether a frame's file is distnb's or IPython's own (magics run under IPython's)."""
    ipython = getattr(sys.modules.get("IPython"), "__file__", None)
    folders = [_DISTNB, *([os.path.dirname(ipython)] if ipython else [])]
    return filename.startswith("<decorator-gen") or any(
        filename.startswith(folder + os.sep) for folder in folders
    )


_DISTNB = os.path.dirname(os.path.abspath(__file__))


class ConfigError(_OneMessage, DistnbError, ValueError):
    """A bad argument to a distnb function; the message names the value and the fix."""


class SessionError(_OneMessage, DistnbError):
    """The session cannot do what was asked in its current state."""


class DebuggerQuit(_OneMessage, DistnbError):
    """The user quit a rank's debugger (`q`, or an interrupt while its prompt was open): the
    rank's cell ends here, and peers waiting for it at a collective are released. The message
    says where the rank was; the only frame left is the debugger's own."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or the kernel's interrupt) stopped a distnb command; the message says what was
    interrupted and the state it left (`%dist_diff --watch was interrupted: no rank watches
    model; run it again`).

    A KeyboardInterrupt, so code that handles one handles this; rendered as that one line, since
    the kernel's frames it passed through are distnb's machinery.
    """

    def _render_traceback_(self) -> list[str]:
        return [f"KeyboardInterrupt: {self}"]


class CellInterrupted(Interrupted):
    """Ctrl-C stopped a cell: the ranks still running were interrupted, and the message says
    where each was (`cell In[3] interrupted: rank 0 waiting at all_reduce #0 ... for rank 1;
    rank 1 at cell In[3] line 5: time.sleep(30)`)."""


class CallInterrupted(Interrupted):
    """Ctrl-C stopped one of distnb's calls on the ranks (`Session.call`): `done` holds the
    ranks where it had finished, `cut` those where it was interrupted or never began."""

    def __init__(self, message: str, done: Sequence[int] = (), cut: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.done, self.cut = tuple(done), tuple(cut)


class RankError(DistnbError):
    """A cell failed on one or more ranks.

    `failures` holds one `RankFailure` per failing rank, in rank order.
    """

    def __init__(self, message: str, failures: Sequence[RankFailure] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.failures = tuple(sorted(failures, key=lambda f: f.rank))

    def _render_traceback_(self) -> list[str]:
        """IPython calls this instead of printing a Python traceback of the kernel's frames.

        Ranks' own errors come before the checked runtime's (which only follow from them)."""
        lines = [f"{type(self).__name__}: {self.message}"]
        groups = sorted(
            group_failures(self.failures), key=lambda g: g[1].ename.startswith("Collective")
        )
        full = False  # the last entry was a whole traceback: a blank line after it
        coloured = _shell_colours()
        for i, (ranks, failure) in enumerate(groups):
            label = format_ranks(ranks)
            was_full, full = full, i < TRACEBACK_LIMIT and _adds_to_summary(failure)
            if full or was_full:
                lines.append("")
            lines.append(f"[{label}] {failure.summary}")
            if full:
                trace = failure.traceback if coloured else _ANSI.sub("", failure.traceback)
                lines.extend(trace.rstrip("\n").splitlines())
        if len(groups) > TRACEBACK_LIMIT:
            lines.append(f"... {len(groups) - TRACEBACK_LIMIT} more: see err.failures")
        return lines


class RankTimeoutError(RankError):
    """The cell was still running on some ranks at its timeout.

    `reports` holds one `RankReport` per rank: finished, failed or running (with its stack).
    """

    def __init__(
        self, message: str, reports: Sequence[RankReport], failures: Sequence[RankFailure] = ()
    ) -> None:
        super().__init__(message, failures)
        self.reports = tuple(reports)

    def _render_traceback_(self) -> list[str]:
        """A line per rank and its stack; from `GROUP_FROM` ranks on, ranks in the same state
        at the same place with the same stack share one (`[ranks 0-15,17-31] running: waiting
        at all_reduce #3 ...`), so the rank that holds the others up stands apart."""
        lines = [f"{type(self).__name__}: {self.message}"]
        said = [(r.rank, (r.state.value, r.detail, r.stack)) for r in self.reports]
        if len(said) < GROUP_FROM:
            groups = [([rank], what) for rank, what in said]
        else:
            groups = same_ranks(said)
        for ranks, (state, detail, stack) in groups:
            label = format_ranks(ranks)
            lines.append(f"[{label}] {state}{f': {detail}' if detail else ''}")
            lines.extend("    " + line for line in stack.rstrip("\n").splitlines())
        return lines


class RankDiedError(RankError):
    """A rank's process exited while it ran a cell; `%dist_restart` brings the cluster back."""


class CollectiveError(RankError):
    """The checked runtime stopped a collective before any data moved.

    Its message already names every rank's call and line; the ranks' tracebacks (which end in
    distnb's own frames) stay on `err.failures` instead of being printed.
    """

    def _render_traceback_(self) -> list[str]:
        lines = [f"{type(self).__name__}: {self.message}"]
        if self.failures:
            lines.append(f"(raised on {format_ranks(f.rank for f in self.failures)})")
        return lines


class CollectiveMismatchError(CollectiveError):
    """Ranks called collectives that do not fit together (op, shape, dtype, root, ...).

    `mismatch` is the record (kind, op, seq, each rank's fingerprint), when known.
    """

    def __init__(
        self,
        message: str,
        failures: Sequence[RankFailure] = (),
        mismatch: Mismatch | None = None,
    ) -> None:
        super().__init__(message, failures)
        self.mismatch = mismatch


class CollectiveDesyncError(CollectiveError):
    """A rank never arrived at a collective that its peers wait at."""


class OverflowStop(DistnbError):
    """The overflow tracer stopped the run as asked (`abort_after`); `report` says what it saw.

    Raised on a rank, it detaches the tracer's hooks first; the cell then fails in the kernel
    with a `RankError` naming the rank, and the cluster stays usable.
    """

    def __init__(self, message: str, report: RankOverflowReport | None = None) -> None:
        super().__init__(message)
        self.report = report

    def __reduce__(self) -> tuple[Any, ...]:  # keeps `report` when pickled to the kernel
        return (type(self), (str(self), self.report))


class NonFiniteError(OverflowStop):
    """A watched tensor held NaN or Inf and the watch had `stop_on_nonfinite=True`."""


class ReplicasDivergedError(DistnbError):
    """A replica watch with `--raise` saw replicas differ: raised on the rank that saw it, in
    the step where it did (see `%dist_diff NAME --report`)."""


def group_failures(
    failures: Iterable[RankFailure],
) -> list[tuple[list[int], RankFailure]]:
    """Group failures whose error and traceback agree, keeping the lowest rank's copy."""
    groups: dict[tuple[str, str, str], tuple[list[int], RankFailure]] = {}
    for failure in sorted(failures, key=lambda f: f.rank):
        key = (failure.ename, failure.evalue, failure.traceback)
        groups.setdefault(key, ([], failure))[0].append(failure.rank)
    return list(groups.values())


def _adds_to_summary(failure: RankFailure) -> bool:
    """Whether a rank's traceback says more than its summary line: one rendered as its message
    alone (`DebuggerQuit`, distnb's own errors) would print the same line twice."""
    shown = [line.strip() for line in _ANSI.sub("", failure.traceback).strip().splitlines()]
    return bool(shown) and shown != [failure.summary]
