"""`%dist_status` / `s.status()` with what each rank runs with, on real ranks; a rank the OOM
killer killed, named as such."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import distnb
from distnb.errors import RankError
from distnb.session.cluster.oom import OOM_TEXT
from distnb.session.status import PROBE_TIMEOUT_S

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from distnb.session import Session

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize("how", ["python", "magic"])
def test_status_shows_each_rank_memory_intra_op_threads_and_environment(
    how: str, session: Session, shell: InteractiveShell
) -> None:
    session.run(
        "import os\nos.environ['NCCL_DEBUG'] = 'INFO' if rank == 0 else 'WARN'\n"
        "os.environ['TORCH_DISTRIBUTED_DEBUG'] = 'DETAIL'\n"
        "_threads = torch.get_num_threads()\ntorch.set_num_threads(3)"
    )
    try:
        status = session.status() if how == "python" else shell.run_line_magic("dist_status", "")
    finally:
        session.run(
            "del os.environ['NCCL_DEBUG'], os.environ['TORCH_DISTRIBUTED_DEBUG']\n"
            "torch.set_num_threads(_threads)"
        )
    assert status.states == ("alive", "alive")
    for res in status.resources:
        assert res is not None and 100 * 2**20 < res.rss <= res.peak_rss + 2**20
        # torch's intra-op threads, as set on the rank; the process runs many more threads
        assert res.intra_op_threads == 3 and res.cuda is None
        assert dict(res.env)["OMP_NUM_THREADS"]
    env = status.env()
    assert env[0][:3] == ("NCCL_DEBUG", "INFO", "rank 0") and env[0][3]
    assert ("TORCH_DISTRIBUTED_DEBUG", "DETAIL", "ranks 0-1", False) in env
    text = repr(status)
    assert "memory (peak)" in text and "intra-op threads" in text and "NCCL_DEBUG=WARN" in text
    assert "cuda" not in text


def test_a_rank_killed_by_the_oom_killer_is_named(small_cgroup: Path) -> None:
    with distnb.start(2, progress=False) as s:
        stopped = s.ranks[0].pid
        os.kill(stopped, signal.SIGSTOP)
        try:
            started = time.monotonic()
            status = s.status()
            assert status.states == ("no answer", "alive")
            assert time.monotonic() - started < 5 * PROBE_TIMEOUT_S  # no hang on a stopped rank
        finally:
            os.kill(stopped, signal.SIGCONT)

        (small_cgroup / "cgroup.procs").write_text(str(s.ranks[1].pid))
        with pytest.raises(RankError):
            s.run("if rank == 1:\n    hog = torch.ones(2**28)", ranks=[1])
        status = s.status()
        assert status.states == ("alive", OOM_TEXT)
        assert f"rank 1 (pid {s.ranks[1].pid}) {OOM_TEXT}" in status.note
        assert "then run %dist_restart" in status.note
        assert "was killed by the OOM killer" in repr(status)
