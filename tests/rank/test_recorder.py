"""The bounded event ring."""

from __future__ import annotations

import pytest

from distnb.errors import ConfigError
from distnb.rank.checked.recorder import Recorder


def entry(seq: int, run_id: int | None) -> list[object]:
    return [0, "WORLD", seq, "all_reduce", 32, ("f.py", 3, -1, "x"), 1, 2, 3, run_id, 2, ""]


def test_ring_keeps_the_last_events_in_order() -> None:
    rec = Recorder(3)
    for seq in range(5):
        rec.add(entry(seq, run_id=seq // 2))
    assert [e.seq for e in rec.events()] == [2, 3, 4]
    assert [e.seq for e in rec.events(since_run=2)] == [4]
    event = rec.events()[0]
    assert event.site.file == "f.py" and event.site.cell is None and event.run_id == 1
    rec.clear()
    assert rec.events() == []


def test_ring_size_must_be_positive() -> None:
    with pytest.raises(ConfigError):
        Recorder(0)
