"""One debugger command to many stopped ranks: `ranks all p loss`, `ranks 0-3 n`, `ranks dp=1 c`.

With `breakpoint()` in a training step every rank stops, and answering each rank's prompt in
turn does not scale. At any debugger prompt, `ranks SELECTION COMMAND` sends COMMAND to every
stopped rank in SELECTION at once (`distnb.session.debugger.desk`), and shows the answers one
block per distinct answer, labelled by the ranks that gave it (`[ranks 0-7] tensor(0.5)`).
SELECTION is `all`, a list of ranks (`0-3,6`), or a slice of the DeviceMesh the ranks' code
uses (`dp=1`, `dp=1,tp=0:4`: Python's end-exclusive slices, as Monarch's `ranks(dp=1,
tp=slice(0, 4))`), read from each stopped rank's mesh coordinates (`InputRequest.mesh`): the
grammar of `distnb.ranklist.parse_ranks`, which `--ranks` and Python's `ranks=` read too.

This module is the pure part: parsing, choosing the ranks, grouping the answers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from distnb.ranklist import RankSelection, format_ranks, parse_ranks
from distnb.records.debug import InputRequest

__all__ = ["USAGE", "Selection", "group_answers", "parse", "select"]

USAGE = (
    "ranks SELECTION COMMAND: e.g. `ranks all p loss`, `ranks 0-3,6 n`, `ranks dp=1 p x.shape`, "
    "`ranks dp=1,tp=0:4 c` (`ranks` alone lists where every rank is)"
)
_COMMAND = re.compile(r"\s*ranks\s+(\S+)\s+(\S.*?)\s*$")

# A selection is what `distnb.ranklist.parse_ranks` reads: `--ranks` and `ranks=` share it.
Selection = RankSelection


def parse(line: str) -> tuple[Selection, str] | None:
    """(the selection, the command) of `ranks SELECTION COMMAND`; None for any other line.

    Raises ValueError, with the usage, for a selection that does not read."""
    match = _COMMAND.match(line)
    if match is None:
        return None
    spec, command = match.groups()
    try:
        return parse_ranks(spec), command
    except ValueError as exc:
        raise ValueError(f"{exc}; {USAGE}") from None


def select(
    selection: Selection, stopped: Mapping[int, InputRequest], ranks: list[int]
) -> tuple[list[int], str]:
    """The stopped ranks `selection` names (of the run's `ranks`), and a note on those it
    names that cannot take the command ("" when none)."""
    if selection.everyone:
        return sorted(stopped), ""
    if selection.ranks:
        unknown = [r for r in selection.ranks if r not in ranks]
        if unknown:
            return [], f"no {format_ranks(unknown)} in this run (it runs {format_ranks(ranks)})"
        chosen = [r for r in selection.ranks if r in stopped]
        missing = [r for r in selection.ranks if r not in stopped]
        return chosen, f"{format_ranks(missing)} not stopped" if missing else ""
    return _select_mesh(selection, stopped)


def _select_mesh(
    selection: Selection, stopped: Mapping[int, InputRequest]
) -> tuple[list[int], str]:
    meshless = [r for r, q in stopped.items() if not q.mesh]
    if meshless and len(meshless) == len(stopped):
        return [], (
            "the stopped ranks see no DeviceMesh with named dimensions where they stopped; "
            "select them by rank (`ranks 0-3 CMD`)"
        )
    names = {name for q in stopped.values() for name in q.mesh}
    unknown = sorted({d for d, _, _ in selection.mesh} - names)
    if unknown:
        has = ", ".join(sorted(names))
        return [], f"no mesh dimension {', '.join(unknown)}: the mesh has {has}"
    chosen = [
        r
        for r, q in sorted(stopped.items())
        if q.mesh and all(a <= q.mesh.get(d, -1) < b for d, a, b in selection.mesh)
    ]
    note = f"{format_ranks(meshless)} see no DeviceMesh" if meshless else ""
    return chosen, note


def group_answers(answers: Mapping[int, str]) -> str:
    """Each distinct answer once, its lines labelled by the ranks that gave it, in rank order
    of the first: `[ranks 0-7] tensor(0.5)`. Ranks that printed nothing are named too."""
    groups: dict[str, list[int]] = {}
    for rank in sorted(answers):
        groups.setdefault(answers[rank], []).append(rank)
    blocks = []
    for text, ranks in groups.items():
        label = format_ranks(ranks)
        body = text[:-1] if text.endswith("\n") else text
        if not body:
            blocks.append(f"[{label}] (nothing printed)\n")
            continue
        blocks.append("".join(f"[{label}] {line}\n" for line in body.split("\n")))
    return "".join(blocks)
