"""Rank-side widgets when the session has no widget frontend (here: no Jupyter kernel)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from distnb.session import Session

pytestmark = pytest.mark.cluster


def test_tqdm_auto_and_widgets_on_ranks_are_text_outside_jupyter(
    session: Session, shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under terminal IPython (the `shell`): displays from ranks are published through it."""
    session.run(
        "from tqdm.auto import tqdm, trange\n"
        "for i in tqdm(range(3), desc=f'r{rank}'):\n    pass\n"
        "for i in trange(2):\n    pass\n"
        "import ipywidgets\ndisplay(ipywidgets.IntSlider(rank))"
    )
    captured = capsys.readouterr()
    assert "[rank 1] r1: 100%" in captured.err and "3/3" in captured.err
    assert "2/2" in captured.err
    assert "[rank 1] IntSlider(value=1)" in captured.out
    result = session.run("import tqdm.auto\nprint(tqdm.auto.tqdm.__mro__[1].__module__)")
    assert result.stdout(0) == result.stdout(1) == "tqdm.std\n"
