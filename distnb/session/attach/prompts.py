"""An attached job's stopped ranks, as the text debugger's desk sees them.

The desk (`distnb.session.debugger.desk.Desk`) asks the user for the prompts of stopped ranks
and answers them; it needs where the prompts come from (`asks`, `answer`: the `Prompts` of the
job's control plane, with the keys distnb's own ranks use) and the run it serves (`RunView`:
what each rank printed before its prompt). A stopped rank of an attached job prints into the
job's store (`distnb.rank.agent.stopped.Out`); `written` pulls those pieces and `show_output`
shows them with `[rank N]` in front, as the output of distnb's own ranks is shown.

`JobPrompts.asks` returns every prompt not answered yet, for the job's own callers (`run`,
`resume`, `detach`); the desk reads each prompt once (`DeskPrompts`), as from the session's
control plane: a prompt it read again while asking would be asked twice, and the answer to the
second ask would go to a prompt the rank has already left.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from distnb.contract import keys
from distnb.records.cell import RankState
from distnb.records.debug import InputRequest

__all__ = ["DeskPrompts", "JobPrompts"]


class JobPrompts:
    """See the module. Counts start where the ranks are when the notebook attaches."""

    def __init__(self, store: Any, ranks: Sequence[int]) -> None:
        self.store = store
        self.ranks = list(ranks)
        self._asked = dict(zip(self.ranks, self._counts(keys.ask_count), strict=True))
        self._pieces: dict[int, int] = {}
        self._chars: dict[int, int] = {}
        for rank, raw in zip(self.ranks, self._raw(keys.agent_out_count), strict=True):
            pieces, chars = raw.split() if raw else ("0", "0")
            self._pieces[rank], self._chars[rank] = int(pieces), int(chars)
        self._unshown: dict[int, str] = {}
        self.open: dict[int, InputRequest] = {}  # prompts read and not answered yet, by rank
        self.words: dict[int, str] = {}  # where each rank is, for the desk's `ranks` command

    def _raw(self, key: Any) -> list[str]:
        names = [key(r) for r in self.ranks]
        return [
            self.store.multi_get([n])[0].decode() if self.store.check([n]) else "" for n in names
        ]

    def _counts(self, key: Any) -> list[int]:
        return [int(v) if v.isdigit() else 0 for v in self._raw(key)]

    # --- Prompts ------------------------------------------------------------------------------

    def asks(self) -> list[InputRequest]:
        """Every prompt not answered yet (those read before too: `run` and the desk share
        them)."""
        for rank, count in zip(self.ranks, self._counts(keys.ask_count), strict=True):
            while self._asked[rank] < count:
                self._asked[rank] += 1
                key = keys.ask(keys.ask_number(rank, self._asked[rank]))
                if self.store.check([key]):
                    self.open[rank] = InputRequest.from_json(self.store.get(key))
                    self.store.delete_key(key)
        return list(self.open.values())

    def answer(self, n: int, line: str) -> None:
        self.store.set(keys.answer(n), line)
        for rank, request in list(self.open.items()):
            if request.n == n:
                del self.open[rank]

    # --- RunView ------------------------------------------------------------------------------

    def states(self) -> dict[int, RankState]:
        return dict.fromkeys(self.ranks, RankState.RUNNING)

    def written(self, rank: int) -> tuple[int, int]:
        """Characters of the rank's debugger output received so far (pulling new pieces)."""
        while True:
            key = keys.agent_out(rank, self._pieces[rank])
            if not self.store.check([key]):
                break
            text = self.store.get(key).decode(errors="replace")
            self.store.delete_key(key)
            self._pieces[rank] += 1
            self._chars[rank] += len(text)
            self._unshown[rank] = self._unshown.get(rank, "") + text
        return self._chars[rank], self._chars[rank]

    def show_output(self) -> None:
        for rank in sorted(self._unshown):
            self.written(rank)
        for rank, text in sorted(self._unshown.items()):
            if text:
                lines = text.rstrip("\n").split("\n")
                print("\n".join(f"[rank {rank}] {line}" for line in lines), flush=True)
        self._unshown.clear()

    def take_output(self, upto: dict[int, tuple[int, int]]) -> dict[int, str]:
        """Each rank's output not shown yet, now counted as shown (the pieces come whole, so
        the counts are reached once they are pulled)."""
        return {rank: self.take(rank) for rank in upto}

    def take(self, rank: int) -> str:
        """What the rank printed and was not shown yet (for `run`, which returns it)."""
        self.written(rank)
        return self._unshown.pop(rank, "")

    def beacon_words(self) -> dict[int, str]:
        return dict(self.words)


class DeskPrompts:
    """The job's prompts as the desk's `Prompts`: `asks` returns those posted since the last
    call (each open prompt once), as the session's control plane does."""

    def __init__(self, prompts: JobPrompts) -> None:
        self.prompts = prompts
        self._read: set[int] = set()  # the prompts (their `n`) handed to the desk

    def asks(self) -> list[InputRequest]:
        found = [r for r in self.prompts.asks() if r.n not in self._read]
        self._read.update(r.n for r in found)
        return found

    def answer(self, n: int, line: str) -> None:
        self.prompts.answer(n, line)
