"""Showing a cell's output, rank by rank, as it comes.

- In a Jupyter kernel each rank gets its own output area, created in rank order when the cell
  starts and updated in place as the rank prints; when the cell ends, the areas give way to one
  view of every rank's lines merged, identical lines collapsed (`distnb.views.lines`).
- In a terminal (terminal IPython, a script run by hand) nothing can be updated in place: each
  line is printed once it is complete, labelled with its rank. A line waits up to `HOLD_S` for
  the other ranks that may still print the same line, so that `[ranks 0-1] hello` is printed
  once; a line with no newline yet is printed at the end of the cell (or before a prompt).
- Elsewhere (output captured or piped: tests, logs) nobody watches: the lines are printed
  once, merged, when the cell ends, in an order that does not depend on timing.

A rank's debugger prompt changes that in a kernel (`hold`): a prompt and its answer show below
the areas, so redrawing the areas would put the rank's answers above the commands that asked
for them. From the first prompt on, the areas keep what they show and the rest of the output is
printed below as it comes, as in a terminal, in the order things happened.

Each line goes to the stream the rank wrote it to, in the order the rank wrote it. Rich outputs
(`display(...)`, a cell's last expression) follow the text, labelled by rank; from `GROUP_FROM`
ranks on, ranks that displayed the same things show them once (`[ranks 0-31] torch.Size([8])`).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from distnb.ranklist import GROUP_FROM, format_ranks, same_ranks
from distnb.views.display import in_kernel
from distnb.views.lines import Group, Line, Merger, Splitter, Write

__all__ = ["HOLD_S", "CellOutput", "RankOutput"]

# How long a complete line waits, in a terminal, for other ranks that may print the same line.
# Engines send their output every 0.2 s (ipykernel's flush interval), each on its own clock, so
# the same line of two ranks usually arrives less than that apart.
HOLD_S = 0.3


@dataclass
class RankOutput:
    """What one rank's part of a cell printed and displayed.

    `writes` are its stream messages in the order the kernel received them (stdout and stderr
    interleaved as written); `stdout` and `stderr` are each stream's whole text.
    """

    rank: int
    stdout: str = ""
    stderr: str = ""
    displays: list[dict[str, Any]] = field(default_factory=list)
    writes: Sequence[Write] = ()

    def __post_init__(self) -> None:
        if not self.writes and (self.stdout or self.stderr):  # made from the texts alone
            self.writes = (Write("stdout", self.stdout), Write("stderr", self.stderr))


class CellOutput:
    """One cell's output: live areas (a kernel), lines as they come (a terminal), or everything
    at the end (nobody watching); see the module's docstring."""

    def __init__(self, ranks: Sequence[int]) -> None:
        self.ranks = list(ranks)
        self.kernel = in_kernel()
        self.live = self.kernel or _watched()
        self._fed = dict.fromkeys(self.ranks, 0)  # writes taken in, per rank
        self._splitters = {rank: Splitter() for rank in self.ranks}
        self._merger = Merger(self.ranks)
        self._areas: dict[int, Any] = {}
        self._text = dict.fromkeys(self.ranks, "")  # a kernel's area: the rank's lines so far
        self.held = False  # a prompt opened in a kernel: the areas stay, the rest is printed
        if self.kernel:
            from IPython.display import display

            for rank in self.ranks:
                self._areas[rank] = display(_Text(""), display_id=True)  # type: ignore[no-untyped-call]

    def holding(self) -> bool:
        """Whether lines wait to be printed (a terminal holds a line back a moment)."""
        return not self.kernel and self._merger.pending()

    def update(
        self, outputs: Sequence[RankOutput], printing: Callable[[], Collection[int]] = tuple
    ) -> None:
        """Show what arrived since the last call (live only). `printing()`: the ranks whose
        output may still come (a rank's output can trail its result), asked only when a line
        waits for them."""
        if not self.live:
            return
        changed = self._feed(outputs)
        if self.kernel and not self.held:
            self._show_areas(changed)
            return
        now = time.monotonic()
        still: list[Collection[int]] = []  # printing(), once asked

        def ready(line: Line, quiet: Sequence[int]) -> bool:
            if now - line.at >= HOLD_S:
                return True
            if not still:
                still.append(printing())
            return not any(r in still[0] for r in quiet)

        _print(self._merger.take(ready))

    def progress(self, outputs: Sequence[RankOutput]) -> None:
        """Show everything each rank printed so far, now (before a prompt): updated areas in a
        kernel; elsewhere every line not printed yet, unfinished ones too."""
        changed = self._feed(outputs)
        if self.kernel and not self.held:
            self._show_areas(changed)
            return
        self._take_tails()
        _print(self._merger.take())

    def hold(self) -> None:
        """Leave a kernel's areas as they are: from now on, output is printed below as it
        comes (see the module's docstring)."""
        if self.kernel and not self.held:
            self.held = True
            self._merger.drop()  # what the areas show is not printed again

    def take(self, outputs: Sequence[RankOutput], ranks: Collection[int]) -> dict[int, str]:
        """Each listed rank's output not shown yet, as text; it counts as shown (the caller shows
        it its own way: the answers of several ranks to one debugger command, grouped)."""
        self._feed(outputs)
        taken = {}
        for rank in ranks:
            if rank in self._splitters:
                lines = "".join(f"{line.text}\n" for line in self._merger.pop(rank))
                taken[rank] = lines + "".join(t.text for t in self._splitters[rank].tails())
        return taken

    def finish(self, outputs: Sequence[RankOutput]) -> None:
        """The final output: every rank's lines merged, then rich outputs in rank order."""
        self._feed(outputs)
        self._take_tails()
        groups = self._merger.take()
        if self.kernel and not self.held:
            self._finish_areas(groups)
        else:
            _print(groups)
        _publish_displays(outputs)

    def _feed(self, outputs: Sequence[RankOutput]) -> list[int]:
        """Take in the writes not seen yet; return the ranks that had some."""
        changed = []
        for out in outputs:
            done = self._fed.get(out.rank)
            if done is None or len(out.writes) == done:
                continue
            new = out.writes[done:]
            self._fed[out.rank] = done + len(new)
            lines = self._splitters[out.rank].feed(new)
            self._merger.add(out.rank, lines)
            self._text[out.rank] += "".join(f"[rank {out.rank}] {line.text}\n" for line in lines)
            changed.append(out.rank)
        return changed

    def _take_tails(self) -> None:
        for rank, splitter in self._splitters.items():
            self._merger.add(rank, splitter.tails())

    def _show_areas(self, ranks: Sequence[int]) -> None:
        for rank in ranks:
            tails = self._splitters[rank].peek()
            text = self._text[rank] + "".join(f"[rank {rank}] {line.text}\n" for line in tails)
            self._areas[rank].update(_Text(text))

    def _finish_areas(self, groups: Sequence[Group]) -> None:
        """The merged view in the first rank's area; the other areas emptied."""
        if not self.ranks:
            return
        first, *rest = self.ranks
        self._areas[first].update(_Text("".join(g.render() for g in groups)))
        for rank in rest:
            if self._text[rank] or self._fed[rank]:
                self._areas[rank].update(_Text(""))


def _watched() -> bool:
    """Whether a person watches this process's output as it comes: stdout is a terminal
    (asked once per stdout object: the system call is not free on a loaded machine)."""
    stream = sys.stdout
    if _tty and _tty[0] is stream:
        return bool(_tty[1])
    try:
        answer = stream.isatty()
    except (AttributeError, ValueError):  # no stdout, or a closed one
        answer = False
    _tty[:] = [stream, answer]
    return bool(answer)


_tty: list[Any] = []  # [the stdout last asked, whether it is a terminal]


def _print(groups: Sequence[Group]) -> None:
    """Each group's line on the stream its ranks wrote it to, flushed in order."""
    last: TextIO | None = None
    for group in groups:
        stream = sys.stderr if group.stream == "stderr" else sys.stdout
        if last is not None and stream is not last:
            last.flush()
        stream.write(group.render())
        last = stream
    if last is not None:
        last.flush()


def _publish_displays(outputs: Sequence[RankOutput]) -> None:
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        return
    for ranks, displays in _same_displays(outputs):
        for content in displays:
            data = dict(content.get("data", {}))
            if "text/plain" in data:
                data["text/plain"] = f"[{format_ranks(ranks)}] {data['text/plain']}"
            metadata = dict(content.get("metadata") or {})
            metadata["rank"] = ranks[0]
            if len(ranks) > 1:
                metadata["ranks"] = ranks
            shell.display_pub.publish(data=data, metadata=metadata)


def _same_displays(outputs: Sequence[RankOutput]) -> list[tuple[list[int], list[dict[str, Any]]]]:
    """Each rank's rich outputs; from `GROUP_FROM` ranks on, ranks that displayed the same
    things share them (32 copies of `torch.Size([8])` read as one, labelled `[ranks 0-31]`)."""
    if len(outputs) < GROUP_FROM:
        return [([out.rank], list(out.displays)) for out in outputs]
    # what is shown, not the engine's own numbering (execution counts differ by engine)
    keyed = [
        (o.rank, json.dumps([d.get("data") for d in o.displays], default=str)) for o in outputs
    ]
    first = {o.rank: list(o.displays) for o in outputs}
    return [(ranks, first[ranks[0]]) for ranks, _ in same_ranks(keyed) if first[ranks[0]]]


class _Text:
    """Plain text that Jupyter shows verbatim (no HTML escaping issues, no repr quotes)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text.rstrip("\n")

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.text.rstrip("\n"))
