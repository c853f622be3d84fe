"""A cell's output as lines: each rank's writes cut into lines, and the ranks' lines merged into
one reading order with identical lines collapsed (`[ranks 0-3] hello`).

Terms: a **write** is one stream message of a rank (stdout or stderr), as the kernel received
it; a **line** is a rank's text up to a newline, in the order the rank wrote it whichever
stream it went to; a **group** is one line shown once for every rank that printed it at the
same place.

Why lines and not whole outputs: ranks usually print the same thing with a few rank-specific
values in between (`print("hello")`, then `print("bye", rank)`); collapsing only identical whole
outputs showed `hello` once per rank. Merging reads each rank's lines as a queue and, step by
step, shows the head that comes first (the lowest line index, then the lowest rank) once, for
every rank whose head is the same line. A rank's run of lines that no other rank has at that
place (a tensor printed over several lines, a traceback) stays together as a block, so it reads
as the rank printed it. Pure functions over records, so the terminal (lines as they come) and a
notebook's final view (everything at once) show the same order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from distnb.ranklist import format_ranks

__all__ = ["Group", "Line", "Merger", "Splitter", "Write", "merge", "split_lines"]


@dataclass(frozen=True, slots=True)
class Write:
    """One stream message of a rank: `stream` is "stdout" or "stderr"; `at` is when the kernel
    received it (`time.monotonic()`), for holding a line back a moment in a live merge."""

    stream: str
    text: str
    at: float = 0.0


@dataclass(frozen=True, slots=True)
class Line:
    """One line of a rank's output, without its newline; `at`: when its end arrived."""

    stream: str
    text: str
    at: float = 0.0


@dataclass(frozen=True, slots=True)
class Group:
    """A line shown once for `ranks`, which all printed it at the same place."""

    ranks: tuple[int, ...]
    stream: str
    text: str

    def render(self) -> str:
        """`[ranks 0-1] hello` with its newline."""
        return f"[{format_ranks(self.ranks)}] {self.text}\n"


def _shown(text: str) -> str:
    """What a terminal shows of a line: the text after its last carriage return (a progress bar
    redrawn in place), a Windows line end aside."""
    return text.removesuffix("\r").rsplit("\r", 1)[-1]


class Splitter:
    """One rank's writes cut into lines as they arrive; each stream keeps its unfinished line
    until its newline comes (or `tails` takes it)."""

    def __init__(self) -> None:
        self._open: dict[str, tuple[str, float]] = {}

    def feed(self, writes: Iterable[Write]) -> list[Line]:
        """The lines these writes complete, in the order completed."""
        lines: list[Line] = []
        for w in writes:
            text = self._open.pop(w.stream, ("", 0.0))[0] + w.text
            *done, rest = text.split("\n")
            lines.extend(Line(w.stream, _shown(t), w.at) for t in done)
            if rest:
                self._open[w.stream] = (rest, w.at)
        return lines

    def peek(self) -> list[Line]:
        """The unfinished lines, left in place (stdout's first)."""
        return [
            Line(stream, _shown(text), at)
            for stream, (text, at) in sorted(self._open.items(), key=lambda kv: kv[0] != "stdout")
        ]

    def tails(self) -> list[Line]:
        """The unfinished lines, taken: what follows starts a new line."""
        lines = self.peek()
        self._open.clear()
        return lines


def split_lines(writes: Iterable[Write]) -> list[Line]:
    """Every line of a rank's writes, unfinished ones last."""
    splitter = Splitter()
    return splitter.feed(writes) + splitter.tails()


# Whether the line at hand may be shown now (a live merge waits a moment for other ranks).
Ready = Callable[[Line, Sequence[int]], bool]


class Merger:
    """The ranks' lines in one reading order (see the module's docstring): `add` lines as they
    come, `take` the groups that can be shown."""

    def __init__(self, ranks: Iterable[int]) -> None:
        self._queues: dict[int, deque[Line]] = {r: deque() for r in sorted(ranks)}
        self._lines: dict[int, list[Line]] = {r: [] for r in self._queues}  # all added
        self._taken = dict.fromkeys(self._queues, 0)
        self._block: int | None = None  # the rank whose lines of its own were shown last

    def add(self, rank: int, lines: Sequence[Line]) -> None:
        self._queues[rank].extend(lines)
        self._lines[rank].extend(lines)

    def pending(self) -> bool:
        return any(self._queues.values())

    def pop(self, rank: int) -> list[Line]:
        """Every line of `rank` not taken yet, taken now (shown apart by the caller)."""
        lines = list(self._queues[rank])
        self._queues[rank].clear()
        self._taken[rank] += len(lines)
        self._block = None  # what follows is no longer the run of lines shown last
        return lines

    def drop(self) -> None:
        """Count every line added so far as shown (it was, elsewhere)."""
        for rank in self._queues:
            self.pop(rank)

    def take(self, ready: Ready | None = None) -> list[Group]:
        """The groups that can be shown, in order: all of them without `ready`; with it, up to
        the first line it holds back (told the ranks that have no line waiting)."""
        groups = []
        while True:
            heads = {r: q[0] for r, q in self._queues.items() if q}
            if not heads:
                break
            rank = self._next(heads)
            line = heads[rank]
            if ready is not None and not ready(line, [r for r in self._queues if r not in heads]):
                break
            same = tuple(r for r, h in heads.items() if _same(h, line))
            for r in same:
                self._queues[r].popleft()
                self._taken[r] += 1
            self._block = rank if len(same) == 1 else None
            groups.append(Group(same, line.stream, line.text))
        return groups

    def _next(self, heads: Mapping[int, Line]) -> int:
        """The rank whose head comes next: the block's rank while its lines are its own, else
        the lowest line index, then the lowest rank."""
        block = self._block
        if block is not None and block in heads and self._own(block, heads):
            return block
        return min(heads, key=lambda r: (self._taken[r], r))

    def _own(self, rank: int, heads: Mapping[int, Line]) -> bool:
        """No other rank has the rank's head as its head, or at the same line index."""
        line, index = heads[rank], self._taken[rank]
        for other, lines in self._lines.items():
            if other == rank:
                continue
            if other in heads and _same(heads[other], line):
                return False
            if index < len(lines) and _same(lines[index], line):
                return False
        return True


def _same(a: Line, b: Line) -> bool:
    return a.stream == b.stream and a.text == b.text


def merge(lines: Mapping[int, Sequence[Line]]) -> list[Group]:
    """Every rank's lines in one reading order, identical lines at the same place collapsed."""
    merger = Merger(sorted(lines))
    for rank, rank_lines in lines.items():
        merger.add(rank, rank_lines)
    return merger.take()
