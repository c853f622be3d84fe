"""Messages of many ranks on real ranks: 10 ranks as 2 rehearsal hosts of 5 (`DISTNB_SHM=5`).

From `GROUP_FROM` (9) ranks on, a mismatch says each call once for the ranks that made it and
the odd rank on a line of its own, and a hang report gives one entry to the ranks waiting at the
same place, with the rank that holds them up apart (tests/views/test_many_ranks.py checks the
same from records, at 32 ranks). 10 rather than 8 ranks: up to 8 every rank keeps its own line.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

import distnb
from distnb.errors import CollectiveMismatchError, RankTimeoutError
from distnb.rank.checked.checker import SHM_VAR
from distnb.ranklist import GROUP_FROM
from distnb.session import Session
from distnb.views.mismatch import MismatchView

pytestmark = pytest.mark.cluster

WORLD = 10


@pytest.fixture(scope="module")
def many() -> Iterator[Session]:
    assert WORLD >= GROUP_FROM
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SHM_VAR, "5")  # the engines inherit it at start: 2 hosts of 5
        with distnb.start(WORLD, progress=False) as s:
            yield s


def test_a_mismatch_says_each_call_once_and_the_odd_rank_alone(many: Session) -> None:
    with pytest.raises(CollectiveMismatchError) as caught:
        many.run("x = torch.zeros(2 + (rank == 7))\ndist.broadcast(x, src=0)")
    lines = str(caught.value).splitlines()
    calls = [line.strip() for line in lines if re.match(r"\s+ranks? \d", line)]
    assert len(calls) == 2, lines
    assert calls[0].startswith("ranks 0-6,8-9: broadcast(float32[2], src=0)  at cell In[")
    assert re.match(r"rank 7: +broadcast\(float32\[3\], src=0\)  at cell In\[", calls[1])
    assert "(ranks 0-6,8-9: [2], rank 7: [3])" in lines[0]
    assert caught.value.mismatch is not None
    shown = MismatchView(caught.value.mismatch).shown()
    assert [(row[0], odd) for row, odd in shown] == [("0-6,8-9", False), ("7", True)]
    result = many.run("y = torch.ones(1)\ndist.all_reduce(y)\ny.item()")
    assert {result.result(r) for r in range(WORLD)} == {f"{WORLD}.0"}


def test_a_hang_report_gives_the_waiting_ranks_one_entry_and_the_sleeper_its_own(
    many: Session,
) -> None:
    code = "import time\nx = torch.ones(2)\nif rank == 7:\n    time.sleep(60)\ndist.all_reduce(x)\n"
    with pytest.raises(RankTimeoutError) as caught:
        many.run(code, timeout=8)
    entries = [line for line in caught.value._render_traceback_() if line.startswith("[")]
    assert any(e.startswith("[rank 7] running: still running") for e in entries), entries
    waiting = [e for e in entries if "waiting at all_reduce #" in e]
    assert waiting and all(e.startswith("[ranks ") for e in waiting), entries
    assert len(entries) < WORLD  # grouped: fewer entries than ranks
    named = [int(r) for e in entries for r in re.findall(r"\d+", e.split("]")[0])]
    assert 7 in named
