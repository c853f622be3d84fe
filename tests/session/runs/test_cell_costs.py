"""What a cell costs the kernel per rank, on a real 2-rank cluster: each rank's reply is looked at
once, not at every wake of the wait; each rank's log is found once, not at every cell; and the
client's caches of requests stay as they were, cell after cell."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest

from distnb.errors import RankError
from distnb.session.runs import run as run_module
from distnb.session.runs.failures import error_of

if TYPE_CHECKING:
    from distnb.session import Session


pytestmark = pytest.mark.cluster

# Rank 1 fails at once; rank 0 then prints line after line, each line a wake of the wait.
FAIL_THEN_PRINT = """\
import sys, time
if rank == 1:
    raise ValueError("early")
for i in range(30):
    print(i, flush=True)
    time.sleep(0.005)
"""


def test_a_rank_that_ended_is_looked_at_once_however_often_the_wait_wakes(
    session: Session, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    looked: Counter[int] = Counter()
    wakes = 0
    look = run_module.CellRun._look_at_ended

    def counted_error_of(ar: Any) -> BaseException | None:
        rank = next(r for r, reply in running[0].results.items() if reply is ar)
        looked[rank] += 1
        return error_of(ar)

    def counted_look(self: run_module.CellRun) -> int:
        nonlocal wakes
        running[:] = [self]
        wakes += 1
        return look(self)

    running: list[run_module.CellRun] = []
    monkeypatch.setattr(run_module, "error_of", counted_error_of)
    monkeypatch.setattr(run_module.CellRun, "_look_at_ended", counted_look)
    with pytest.raises(RankError, match="rank 1: ValueError: early"):
        session.run(FAIL_THEN_PRINT)
    out = capsys.readouterr().out
    assert [f"[rank 0] {i}" for i in range(30)] == [
        line for line in out.splitlines() if line.startswith("[rank 0]")
    ]
    assert wakes > 10, wakes  # rank 0's lines woke the wait many times after rank 1 ended
    # once when its reply arrived, once for the cell's result
    assert looked == {0: 2, 1: 2}, looked


def test_each_rank_log_is_found_once_across_cells(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    members = session.cluster.members  # type: ignore[union-attr]
    session.run("pass")  # each rank's log found, if it was not yet
    found: list[int] = []
    log_path = members.log_path

    def counted(pid: int) -> str:
        found.append(pid)
        return log_path(pid)

    monkeypatch.setattr(members, "log_path", counted)
    session.run("import os\nos.write(2, f'rank {rank} wrote to its log\\n'.encode())")
    session.run("pass")
    assert found == []
    # the marks still follow each log: what the cell before wrote is in it, behind the mark
    for info in session.ranks:
        assert f"rank {info.rank} wrote to its log" in members.log_tail(info.pid, lines=50)
        assert "wrote to its log" not in members.log_since_mark(info.pid)


def test_the_clients_caches_stay_as_they_were_cell_after_cell(session: Session) -> None:
    client = session.cluster.client  # type: ignore[union-attr]
    session.run("pass")
    before = len(client.history), len(client.metadata)
    for _ in range(20):
        result = session.run("print(rank)")
    assert [o.stdout for o in result.outputs] == ["0\n", "1\n"]
    assert (len(client.history), len(client.metadata)) == before
    assert not client._futures and not client._output_futures and not client.results
    assert not client.outstanding
    assert not any(client._outstanding_dict.values())
