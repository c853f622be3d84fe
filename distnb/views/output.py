"""Showing a cell's output, rank by rank.

In a Jupyter kernel each rank gets its own output area, created in rank order when the cell
starts and updated live as the rank prints; when the cell ends, ranks whose output is identical
are collapsed into one area labelled with all their ranks. Without a kernel (terminal IPython,
scripts) there are no updatable areas, so the output is printed once, at the end, in rank order.
Rich outputs (`display(...)`, a cell's last expression) follow the text, labelled by rank.

A rank's debugger prompt changes that (`hold`): a prompt and its answer show below the areas, so
redrawing the areas would put the rank's answers above the commands that asked for them. From
the first prompt on, the areas keep what they show and the rest of the output is printed below
as it comes, labelled, in the order things happened (as without a kernel).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from distnb.ranklist import format_ranks
from distnb.views.display import in_kernel


@dataclass
class RankOutput:
    """What one rank's part of a cell printed and displayed."""

    rank: int
    stdout: str = ""
    stderr: str = ""
    displays: list[dict[str, Any]] = field(default_factory=list)


def label_lines(label: str, text: str) -> str:
    """Prefix every line of `text` with `[label] `."""
    if not text:
        return ""
    body = text[:-1] if text.endswith("\n") else text
    return "".join(f"[{label}] {line}\n" for line in body.split("\n"))


def collapse(outputs: Sequence[RankOutput], attr: str) -> list[tuple[str, str]]:
    """(label, text) per distinct non-empty text, in order of the first rank that printed it."""
    groups: dict[str, list[int]] = {}
    for out in outputs:
        text = getattr(out, attr)
        if text:
            groups.setdefault(text, []).append(out.rank)
    return [(format_ranks(ranks), text) for text, ranks in groups.items()]


def render_text(outputs: Sequence[RankOutput], attr: str) -> str:
    return "".join(label_lines(label, text) for label, text in collapse(outputs, attr))


class CellOutput:
    """Live per-rank output areas for one cell (a kernel), or printing at the end (no kernel)."""

    def __init__(self, ranks: Sequence[int]) -> None:
        self.ranks = list(ranks)
        self.live = in_kernel()
        self._handles: dict[int, Any] = {}
        self._shown: dict[int, str] = {}
        self._printed: dict[int, tuple[int, int]] = {}  # printed below (no kernel, or held)
        self._seen: dict[int, tuple[int, int]] = {}  # what the areas show
        self.held = False  # a prompt opened: the areas stay as they are, the rest is printed
        if self.live:
            from IPython.display import display

            for rank in self.ranks:
                self._handles[rank] = display(_Text(""), display_id=True)  # type: ignore[no-untyped-call]

    def update(self, outputs: Sequence[RankOutput]) -> None:
        """Show what each rank printed so far (kernel only)."""
        if not self.live:
            return
        if self.held:
            self._print_new(outputs)
            return
        for out in outputs:
            self._seen[out.rank] = (len(out.stdout), len(out.stderr))
            text = label_lines(f"rank {out.rank}", out.stdout) + label_lines(
                f"rank {out.rank}", out.stderr
            )
            if text != self._shown.get(out.rank, ""):
                self._shown[out.rank] = text
                self._handles[out.rank].update(_Text(text))

    def progress(self, outputs: Sequence[RankOutput]) -> None:
        """Show what each rank printed so far, now (before a prompt): updated areas in a kernel;
        elsewhere, what was not printed yet, labelled (`finish` prints only the rest)."""
        if self.live and not self.held:
            self.update(outputs)
            return
        self._print_new(outputs)

    def hold(self) -> None:
        """Leave the areas as they are: from now on, output is printed below as it comes."""
        if self.live and not self.held:
            self.held = True
            self._printed = dict(self._seen)

    def take(
        self, outputs: Sequence[RankOutput], upto: dict[int, tuple[int, int]]
    ) -> dict[int, str]:
        """Each listed rank's output not shown yet, up to its (stdout, stderr) counts, as text
        (stdout, then stderr); it counts as shown (the caller shows it its own way)."""
        taken = {}
        for out in outputs:
            if out.rank not in upto:
                continue
            done_out, done_err = self._printed.get(out.rank, (0, 0))
            want_out, want_err = upto[out.rank]
            end_out = min(max(want_out, done_out), len(out.stdout))
            end_err = min(max(want_err, done_err), len(out.stderr))
            taken[out.rank] = out.stdout[done_out:end_out] + out.stderr[done_err:end_err]
            self._printed[out.rank] = (end_out, end_err)
        return taken

    def _print_new(self, outputs: Sequence[RankOutput]) -> None:
        for out in outputs:
            done_out, done_err = self._printed.get(out.rank, (0, 0))
            label = f"rank {out.rank}"
            sys.stdout.write(label_lines(label, out.stdout[done_out:]))
            sys.stderr.write(label_lines(label, out.stderr[done_err:]))
            self._printed[out.rank] = (len(out.stdout), len(out.stderr))
        sys.stdout.flush()
        sys.stderr.flush()

    def finish(self, outputs: Sequence[RankOutput]) -> None:
        """Final output: identical text collapsed, then rich outputs in rank order."""
        if self.live and not self.held:
            self._finish_live(outputs)
        else:
            outputs = [self._unprinted(out) for out in outputs]
            sys.stdout.write(render_text(outputs, "stdout"))
            sys.stdout.flush()
            sys.stderr.write(render_text(outputs, "stderr"))
            sys.stderr.flush()
        _publish_displays(outputs)

    def _unprinted(self, out: RankOutput) -> RankOutput:
        done_out, done_err = self._printed.get(out.rank, (0, 0))
        return RankOutput(out.rank, out.stdout[done_out:], out.stderr[done_err:], out.displays)

    def _finish_live(self, outputs: Sequence[RankOutput]) -> None:
        text = render_text(outputs, "stdout") + render_text(outputs, "stderr")
        if not self.ranks:
            return
        first, *rest = self.ranks
        self._handles[first].update(_Text(text))
        for rank in rest:
            if self._shown.get(rank):
                self._handles[rank].update(_Text(""))


def _publish_displays(outputs: Sequence[RankOutput]) -> None:
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        return
    for out in outputs:
        for content in out.displays:
            data = dict(content.get("data", {}))
            if "text/plain" in data:
                data["text/plain"] = f"[rank {out.rank}] {data['text/plain']}"
            metadata = dict(content.get("metadata") or {})
            metadata["rank"] = out.rank
            shell.display_pub.publish(data=data, metadata=metadata)


class _Text:
    """Plain text that Jupyter shows verbatim (no HTML escaping issues, no repr quotes)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text.rstrip("\n")

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.text.rstrip("\n"))
