"""Ranks launched by mpiexec through ipyparallel's MPI launcher (Debian's openmpi on localhost)."""

from __future__ import annotations

import glob
import importlib.util
import shutil

import pytest

import distnb
from harness.processes import running_pids

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.mpi,
    pytest.mark.skipif(
        shutil.which("mpiexec") is None or importlib.util.find_spec("mpi4py") is None,
        reason="needs mpiexec and mpi4py (installed by .ci/run)",
    ),
]


def test_mpi_ranks_agree_with_the_process_group(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # openmpi refuses to run as root unless told; CI runs as root.
    monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT", "1")
    monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    before = set(glob.glob("/dev/shm/*_segment.*"))
    with distnb.start(2, engines="mpi", progress=False) as s:
        pids = s.pids()
        mapped = set(glob.glob("/dev/shm/*_segment.*")) - before
        s.run(
            "import os\n"
            "mpi = os.environ['OMPI_COMM_WORLD_RANK']\n"
            "print('rank', rank, 'pg', dist.get_rank(), 'mpi', mpi)\n"
            "x = torch.tensor([float(rank)])\ndist.all_reduce(x)\nprint('sum', x.item())"
        )
        out = capsys.readouterr().out
        assert "[rank 0] rank 0 pg 0 mpi 0" in out
        assert "[rank 1] rank 1 pg 1 mpi 1" in out
        assert "[ranks 0-1] sum 1.0" in out  # the same line on both ranks, once
    assert not running_pids(pids)
    # OpenMPI removes its shared memory in MPI_Finalize, which killed ranks never reach
    assert mapped, "openmpi made no shared-memory segment: nothing was tested"
    assert not set(glob.glob("/dev/shm/*_segment.*")) - before
