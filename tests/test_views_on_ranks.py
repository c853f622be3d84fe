"""Views fed by real ranks: shape tables of rank namespaces."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.cluster


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
    out = capsys.readouterr().out
    assert "w" in out and "[1]" in out and "[2]" in out


def test_dist_shapes_magic(shell: object, capsys: pytest.CaptureFixture[str]) -> None:
    shell.run_cell_magic("allranks", "", "v = torch.zeros(5)")  # type: ignore[attr-defined]
    shell.run_line_magic("dist_shapes", "v")  # type: ignore[attr-defined]
    assert "[5]" in capsys.readouterr().out
