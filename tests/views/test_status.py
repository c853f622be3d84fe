"""The status table with per-rank resources and environment, and start-up progress (pure)."""

from __future__ import annotations

import re

import pytest

from distnb.records.cell import RankInfo
from distnb.records.resources import CudaMemory, RankResources, env_groups
from distnb.views._format import DIFF_ROW_BG
from distnb.views.status import Progress, Status
from tests.views.test_format import parse

MiB = 2**20
RANKS = (
    RankInfo(0, 0, 0, "vm", 100, "cuda:0", "nccl"),
    RankInfo(1, 1, 1, "vm", 101, "cuda:1", "nccl"),
)


def resources(rank: int, **env: str) -> RankResources:
    cuda = CudaMemory(f"cuda:{rank}", 10 * MiB, 20 * MiB, 15 * MiB, 80 * 2**30)
    return RankResources(rank, 400 * MiB, 500 * MiB, 4, cuda, tuple(sorted(env.items())))


def test_status_shows_memory_cuda_intra_op_threads_and_state_per_rank() -> None:
    status = Status(
        RANKS,
        resources=(resources(0, NCCL_DEBUG="INFO"), None),
        states=("alive", "was killed by the OOM killer"),
    )
    header, row0, row1 = repr(status).splitlines()[:3]
    assert re.split(r"\s{2,}", header) == [
        *("rank", "host", "pid", "device", "backend", "memory (peak)", "intra-op threads"),
        *("cuda allocated", "reserved", "peak", "state"),
    ]
    assert "400.0 MiB (500.0 MiB)" in row0 and "10.0 MiB" in row0 and "15.0 MiB" in row0
    assert row0.endswith("alive") and row1.endswith("was killed by the OOM killer")
    assert row1.split()[5:10] == ["-", "-", "-", "-", "-"]


def test_environment_lists_values_by_rank_differences_first() -> None:
    status = Status(
        RANKS,
        resources=(
            resources(0, OMP_NUM_THREADS="4", CUDA_VISIBLE_DEVICES="0"),
            resources(1, OMP_NUM_THREADS="4", CUDA_VISIBLE_DEVICES="1"),
        ),
        states=("alive", "alive"),
    )
    text = repr(status)
    env = text.split("environment:\n", 1)[1].splitlines()
    assert [line.split() for line in env] == [
        ["CUDA_VISIBLE_DEVICES=0", "rank", "0"],
        ["CUDA_VISIBLE_DEVICES=1", "rank", "1"],
        ["OMP_NUM_THREADS=4", "ranks", "0-1"],
    ]
    rows = parse(status._repr_html_()).rows
    env_rows = [(attrs, [t for _, t in cells]) for attrs, cells in rows if len(cells) == 3]
    assert env_rows[1] == (
        {"style": f"background:{DIFF_ROW_BG}"},
        ["CUDA_VISIBLE_DEVICES", "0", "rank 0"],
    )
    assert env_rows[-1][1] == ["OMP_NUM_THREADS", "4", "ranks 0-1"]


def test_env_groups_name_ranks_where_a_variable_is_unset() -> None:
    groups = env_groups([resources(0, NCCL_DEBUG="INFO"), resources(1)])
    assert groups == [("NCCL_DEBUG", [("INFO", [0]), ("(unset)", [1])])]


def test_status_without_resources_is_the_plain_table() -> None:
    text = repr(Status(RANKS[:1], note="ok"))
    assert text.splitlines() == [
        "rank  host  pid  device  backend",
        "0     vm    100  cuda:0  nccl",
        "ok",
    ]


def test_progress_is_a_text_bar_outside_jupyter_and_silent_when_off(
    capsys: pytest.CaptureFixture[str],
) -> None:
    off = Progress(2, enabled=False)
    off.show("engines registered", 1)
    off.close()
    assert capsys.readouterr() == ("", "")
    bar = Progress(2)
    bar.show("engines registered", 1)
    bar.show("ranks joined the process group", 2)
    bar.close()
    err = capsys.readouterr().err
    assert "distnb: engines registered" in err and "1/2" in err
    assert "distnb: ranks joined the process group" in err and "2/2" in err


def test_ranks_on_several_hosts_get_a_row_per_host() -> None:
    ranks = (
        RankInfo(0, 0, 0, "node1", 100, "cuda:0", "nccl", "10.0.0.1"),
        RankInfo(1, 1, 1, "node1", 101, "cuda:1", "nccl", "10.0.0.1"),
        RankInfo(2, 0, 2, "node2", 200, "cuda:0", "nccl", "10.0.0.2"),
    )
    status = Status(ranks)
    assert status.hosts() == [
        ("node1", "10.0.0.1", "ranks 0-1", "2", "cuda:0, cuda:1"),
        ("node2", "10.0.0.2", "rank 2", "1", "cuda:0"),
    ]
    text = repr(status)
    assert "hosts:" in text and "node2  10.0.0.2  rank 2" in text
    assert "hosts" in status._repr_html_() and "10.0.0.2" in status._repr_html_()
    assert Status(RANKS).hosts() == [] and "hosts:" not in repr(Status(RANKS))  # one host


def test_thirty_two_ranks_on_four_hosts_read_as_four_rows() -> None:
    ranks = tuple(
        RankInfo(
            r, r % 8, r, f"node{r // 8}", 1000 + r, f"cuda:{r % 8}", "nccl", f"10.0.0.{r // 8}"
        )
        for r in range(32)
    )
    res = tuple(
        RankResources(
            r, (400 + r) * MiB, 600 * MiB, 4, CudaMemory(f"cuda:{r % 8}", MiB, MiB, MiB, 2**30)
        )
        for r in range(32)
    )
    rows = Status(ranks, resources=res, states=("alive",) * 32).rows()
    assert [row[:5] for row in rows] == [
        (f"{8 * h}-{8 * h + 7}", f"node{h}", "8 pids", "cuda:0-7", "nccl") for h in range(4)
    ]
    assert rows[0][5] == "400.0 MiB-407.0 MiB (600.0 MiB)" and rows[0][-1] == "alive"


def test_a_rank_that_differs_stands_alone() -> None:
    ranks = tuple(RankInfo(r, r, r, "vm", 100 + r, "cpu", "gloo") for r in range(12))
    states = tuple("died" if r == 5 else "alive" for r in range(12))
    rows = Status(ranks, resources=(), states=states).rows()
    assert [(row[0], row[-1]) for row in rows] == [("0-4,6-11", "alive"), ("5", "died")]
    assert rows[1][2] == "105"  # one rank: its own pid
    assert len(Status(ranks[:8]).rows()) == 8  # a few ranks: a row each
