"""Views fed by real ranks: shape tables of rank namespaces."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.cluster


@pytest.mark.check
def test_shape_table_puts_the_rank_dependent_shape_first(session: object) -> None:
    session.run(  # type: ignore[attr-defined]
        "same = torch.zeros(4, 3)\n"
        "batch = {'x': torch.zeros(2 + rank, 8), 'y': torch.ones(2, dtype=torch.int64)}\n"
        "bad = torch.tensor([float('nan')]) if rank == 1 else torch.zeros(1)\n"
        "model = torch.nn.Linear(3, 2)"
    )
    view = session.shapes()  # type: ignore[attr-defined]
    text = repr(view)
    names = [row.name for row in view.table.rows]
    assert names.index('batch["x"]') < names.index("same")
    assert "[2, 8]" in text and "[3, 8]" in text
    row = next(r for r in view.table.rows if r.name == "bad")
    assert row.nonfinite
    assert "model" in names
    only = session.shapes(["same"])  # type: ignore[attr-defined]
    assert [r.name for r in only.table.rows] == ["same"]


def test_allranks_shapes_shows_what_the_cell_assigned(
    shell: object, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.run_cell_magic("allranks", "--shapes", "w = torch.zeros(rank + 1)\nunrelated = 3")  # type: ignore[attr-defined]
    lines = capsys.readouterr().out.splitlines()
    # the one tensor the cell assigned (`unrelated` is no tensor), its shape differing by rank
    assert "Shapes on ranks 0-1: 1 names, 1 differ across ranks (shape)" in lines
    rows = [line.split() for line in lines if line.startswith("w ")]
    assert rows == [["w", "*[1]", "float32", "cpu", "*[2]", "float32", "cpu", "shape"]]


def test_dist_shapes_magic(shell: object, capsys: pytest.CaptureFixture[str]) -> None:
    shell.run_cell_magic("allranks", "", "v = torch.zeros(5)")  # type: ignore[attr-defined]
    shell.run_line_magic("dist_shapes", "v")  # type: ignore[attr-defined]
    assert "[5]" in capsys.readouterr().out


STRAGGLER = (
    "import time\n"
    "x = torch.ones(256)\n"
    "for step in range(6):\n"
    "    if rank == 1:\n"
    "        time.sleep(0.03)\n"
    "    dist.all_reduce(x)\n"
)


def test_timeline_names_the_straggler(session: object) -> None:
    session.run(STRAGGLER)  # type: ignore[attr-defined]
    view = session.timeline(cells=1)  # type: ignore[attr-defined]
    tl = view.timeline
    assert len(tl.collectives) == 6 and tl.ranks == (0, 1)
    worst = tl.stragglers[0]
    assert worst.rank == 1 and worst.times_last == 6
    assert "line 6: dist.all_reduce(x)" in repr(view)


def test_timeline_export_is_a_valid_trace_with_every_event(
    session: object, tmp_path: object, shell: object
) -> None:
    import json
    from pathlib import Path

    session.run(STRAGGLER)  # type: ignore[attr-defined]
    path = Path(str(tmp_path)) / "trace.json"
    shell.run_line_magic("dist_timeline", f"--cells 1 --export {path}")  # type: ignore[attr-defined]
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    ops = [e for e in events if e.get("ph") == "X" and e.get("name") == "all_reduce"]
    assert len(ops) == 12  # 6 collectives x 2 ranks
    assert {e["pid"] for e in ops} == {0, 1}
    names = {
        e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"
    }
    assert names == {"rank 0", "rank 1"}
    for e in ops:
        assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0


def test_allranks_timeline_shows_the_cell(
    shell: object, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.run_cell_magic("allranks", "--timeline", "x = torch.ones(4)\ndist.all_reduce(x)")  # type: ignore[attr-defined]
    out = capsys.readouterr().out
    assert "Collective timeline: 1 collectives" in out
