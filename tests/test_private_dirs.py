"""The test run keeps out of the user's folders: IPython's history and profiles, Jupyter's config,
data and runtime files, ipyparallel's profiles (tests/conftest.py points them at a private
folder)."""

from __future__ import annotations

import os
import pwd
import sqlite3
from pathlib import Path

import pytest

from harness.kernel_driver import execute
from tests.conftest import PRIVATE_DIRS, PRIVATE_ENV


def sessions(history: Path) -> int:
    """How many sessions an IPython history database holds (0 if there is none yet)."""
    if not history.exists():
        return 0
    with sqlite3.connect(history) as db:
        return int(db.execute("SELECT count(*) FROM sessions").fetchone()[0])


def test_ipython_and_jupyter_resolve_their_folders_to_the_private_one() -> None:
    from IPython.paths import get_ipython_dir
    from jupyter_core.paths import jupyter_config_dir, jupyter_data_dir, jupyter_runtime_dir

    home = pwd.getpwuid(os.getuid()).pw_dir  # the user's, whatever HOME says
    found = [get_ipython_dir(), jupyter_config_dir(), jupyter_data_dir(), jupyter_runtime_dir()]
    for path in found:
        assert Path(path).is_relative_to(PRIVATE_DIRS) and not path.startswith(home + os.sep)
    assert os.environ["IPYTHONDIR"] == PRIVATE_ENV["IPYTHONDIR"]


@pytest.mark.cluster
def test_a_kernel_with_ranks_writes_nothing_under_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Jupyter kernel starts ranks (controller, engines, nannies, reaper), runs a cell on
    them and stops them, all with HOME at an empty folder: nothing may appear there, and the
    kernel's history goes to the private IPython folder."""
    from jupyter_client.manager import start_new_kernel

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    history = Path(PRIVATE_ENV["IPYTHONDIR"]) / "profile_default" / "history.sqlite"
    before = sessions(history)

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        for code in (
            "%load_ext distnb\n%dist_start -n 2",
            "%%allranks\nx = torch.ones(2) * rank\ndist.all_reduce(x)\nprint(x.tolist())",
            "%dist_status",
            "%dist_stop",
        ):
            ran = execute(kc, code)
            assert ran.status == "ok", ran.text
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)

    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == []
    assert sessions(history) == before + 1
