"""A script run with `%dist_run` is the user's code wherever it lies: here under a folder named
site-packages, as an installed package's scripts are (Accelerate's own: see
`test_thirdparty_runs.py`). Call sites, tracebacks, hang reports and death reports name its
lines and those of the modules beside it, never the launcher's cell, on a real 2-rank cluster."""

from __future__ import annotations

import signal
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from distnb.errors import (
    CollectiveDesyncError,
    CollectiveMismatchError,
    RankDiedError,
    RankError,
    RankTimeoutError,
)
from distnb.session.cluster.deaths import crash_site
from distnb.session.runs.scripts import script_request, user_paths
from distnb.userfiles import is_users, script_paths
from harness.processes import plain, running_pids

if TYPE_CHECKING:
    from distnb.session import Session

pytestmark = pytest.mark.cluster

SCRIPTS = {
    "helper.py": """\
        import torch
        import torch.distributed as dist


        def step(rank):
            x = torch.zeros(2 + rank)
            dist.all_reduce(x)
        """,
    "mismatch.py": """\
        import torch.distributed as dist
        import helper

        dist.init_process_group()
        helper.step(dist.get_rank())
        """,
    "fails.py": """\
        import torch.distributed as dist


        def main(rank):
            raise ValueError(f"bad batch on rank {rank}")


        dist.init_process_group()
        main(dist.get_rank())
        """,
    "stops_early.py": """\
        import torch
        import torch.distributed as dist

        dist.init_process_group()
        for epoch in range(3):
            if dist.get_rank() == 1 and epoch == 1:
                break
            dist.all_reduce(torch.ones(1))
        """,
    "sleeps.py": """\
        import os, time
        if os.environ["RANK"] == "1":
            time.sleep(60)
        """,
    "aborts.py": """\
        import torch
        import torch.distributed as dist
        dist.init_process_group()
        t = torch.arange(5.0) if dist.get_rank() == 0 else torch.arange(10.0)
        dist.broadcast(t, src=1)
        """,
}


@pytest.fixture(scope="module")
def pkg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`.../site-packages/pkg/`, holding the scripts and the module they import."""
    folder = tmp_path_factory.mktemp("venv") / "lib" / "site-packages" / "pkg"
    folder.mkdir(parents=True)
    for name, text in SCRIPTS.items():
        (folder / name).write_text(textwrap.dedent(text))
    return folder


def test_the_script_and_its_neighbours_are_the_users_but_a_library_folders_are_not() -> None:
    import sysconfig

    purelib = sysconfig.get_paths()["purelib"]
    accelerate = f"{purelib}/accelerate/test_utils/scripts"
    assert script_paths(f"{accelerate}/test_ops.py") == (
        f"{accelerate}/test_ops.py",
        f"{accelerate}/",
    )
    assert is_users(f"{accelerate}/helper.py", script_paths(f"{accelerate}/test_ops.py"))
    # a script lying in site-packages itself: its neighbours are installed packages
    alone = script_paths(f"{purelib}/tool.py")
    assert alone == (f"{purelib}/tool.py",) and not is_users(f"{purelib}/six.py", alone)
    request = script_request(f"{accelerate}/test_ops.py", "--x 1", 4, 4, (), True, None)
    assert user_paths(request.code) == script_paths(f"{accelerate}/test_ops.py")
    assert user_paths("x = 1") == ()


def test_a_mismatch_names_the_line_of_the_module_beside_the_script(
    session: Session, pkg: Path
) -> None:
    with pytest.raises(CollectiveMismatchError) as info:
        session.run_script(str(pkg / "mismatch.py"))
    message = info.value.message
    for rank in (0, 1):
        assert f"rank {rank}: all_reduce" in message
    assert message.count(f"at {pkg / 'helper.py'}:7: dist.all_reduce(x)") == 2, message
    assert "cell In[" not in message and "run_main" not in message


def test_a_traceback_starts_at_the_scripts_frames(session: Session, pkg: Path) -> None:
    with pytest.raises(RankError) as info:
        session.run_script(str(pkg / "fails.py"))
    text = plain("\n".join(info.value._render_traceback_()))
    assert "ValueError: bad batch on rank 1" in text
    assert f"File {pkg / 'fails.py'}:9" in text and f"File {pkg / 'fails.py'}:5" in text
    assert "run_main" not in text and "Cell In" not in text and "distnb/rank" not in text


def test_a_desync_names_the_scripts_line(session: Session, pkg: Path) -> None:
    with pytest.raises(CollectiveDesyncError) as info:
        session.run_script(str(pkg / "stops_early.py"))
    message = info.value.message
    assert "rank 1 finished" in message and f"{pkg / 'stops_early.py'}:8" in message, message
    assert "cell In[" not in message


def test_a_hang_report_shows_the_scripts_line_first(session: Session, pkg: Path) -> None:
    with pytest.raises(RankTimeoutError) as info:
        session.run_script(str(pkg / "sleeps.py"), timeout=1)
    stack = info.value.reports[1].stack
    assert stack.startswith(f"at {pkg / 'sleeps.py'} line 3: time.sleep(60)"), stack
    assert "run_main" not in stack and "In[" not in stack


def test_a_crash_site_is_the_scripts_line_not_the_launchers() -> None:
    """faulthandler's dump of a rank that died in a script (innermost frame first): the line
    is the script's, found without the launcher cell's code."""
    script = "/venv/lib/site-packages/pkg/aborts.py"
    dump = [
        "Fatal Python error: Aborted",
        "",
        "Current thread 0x1 (most recent call first):",
        '  File "/venv/lib/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper',
        f'  File "{script}", line 5 in <module>',
        '  File "/venv/lib/site-packages/distnb/rank/scripts.py", line 58 in run_main',
        '  File "/tmp/ipykernel_42/1234.py", line 1 in <module>',
    ]
    launcher = script_request(__file__, "", 3, 3, (), True, None).code
    assert crash_site(dump, launcher, script_paths(script)).startswith(f", at {script} line 5")
    assert crash_site(dump, launcher).startswith(", at line 1: __import__")  # a cell's view


@pytest.fixture
def own_session() -> Iterator[Session]:
    """A session of this test's own: a rank dies in it."""
    import distnb

    s = distnb.start(2, progress=False)
    yield s
    pids = s.pids()
    s.stop()
    assert not running_pids(pids)


@pytest.mark.check
def test_a_rank_that_dies_in_a_script_is_reported_at_the_scripts_line(
    own_session: Session, pkg: Path
) -> None:
    with pytest.raises(RankDiedError) as info:
        own_session.run_script(str(pkg / "aborts.py"), check=False, timeout=30)
    text = str(info.value)
    died = next(line for line in text.splitlines() if "killed by" in line)
    assert f"killed by {signal.Signals.SIGABRT.name}" in died, text
    assert died.endswith(f"at {pkg / 'aborts.py'} line 5: dist.broadcast(t, src=1)"), text
