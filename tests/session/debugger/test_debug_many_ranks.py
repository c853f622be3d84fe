"""One debugger command to many stopped ranks, on 4 real ranks in a 2 x 2 DeviceMesh, from a real
kernel: by mesh slice (`ranks dp=1 ...`), by rank list, to all; answers grouped; one prompt."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator

import pytest

from harness.kernel_driver import Frontend, with_ranks
from tests.session.debugger.test_debug_transcript import in_order

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def fe() -> Iterator[Frontend]:
    with with_ranks(4, timeout=240) as fe:
        yield fe


def test_a_command_to_a_mesh_slice_a_list_and_every_rank(fe: Frontend) -> None:
    code = """\
        %%allranks
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh('cpu', (2, 2), mesh_dim_names=('dp', 'tp'))
        def step(mesh):
            dp, tp = mesh.get_coordinate()
            loss = torch.tensor(10.0 * dp + tp)
            breakpoint()
            return loss
        out = step(mesh)
        print('done', rank, out.item())"""
    answers = [
        "ranks dp=1 p loss",
        "ranks tp=0 p (dp, tp)",
        "ranks 1,3 p rank",
        "ranks pp=0 p 1",  # no such dimension: said, nothing sent
        "ranks all w",
        "ranks all c",
    ]
    reply = fe.run(textwrap.dedent(code), answers, timeout=180)
    n = reply.content["execution_count"]
    assert reply.status == "ok", reply.transcript
    assert reply.prompts == ["[rank 0] (Pdb) "] * len(answers)  # one prompt, not one per rank
    in_order(
        reply.transcript,
        "distnb: rank 0 stopped at",
        "also stopped: 1-3",
        "[rank 0] (Pdb) ranks dp=1 p loss",
        "[rank 2] tensor(10.)\n[rank 3] tensor(11.)",
        "[rank 0] (Pdb) ranks tp=0 p (dp, tp)",
        "[rank 0] (0, 0)\n[rank 2] (1, 0)",
        "[rank 0] (Pdb) ranks 1,3 p rank",
        "[rank 1] 1\n[rank 3] 3",
        "[rank 0] (Pdb) ranks pp=0 p 1",
        "distnb: no mesh dimension pp: the mesh has dp, tp",
        "[rank 0] (Pdb) ranks all w",
        f"[ranks 0-3] > cell In[{n}] line 8, in step()",
        "[rank 0] (Pdb) ranks all c",
        "distnb: ranks 0-3 go on (c)",
    )
    for rank, value in enumerate([0.0, 1.0, 10.0, 11.0]):
        assert f"[rank {rank}] done {rank} {value}" in reply.text


def test_the_where_list_names_each_ranks_mesh_place(fe: Frontend) -> None:
    code = (
        "%%allranks\nfrom torch.distributed.device_mesh import init_device_mesh\n"
        "mesh = init_device_mesh('cpu', (2, 2), mesh_dim_names=('dp', 'tp'))\n"
        "breakpoint()\nprint('x')"
    )
    reply = fe.run(code, ["ranks", "ranks all c"], timeout=180)
    assert reply.status == "ok", reply.transcript
    assert "rank 3: stopped in the debugger at cell In" in reply.transcript
    assert "[dp=1, tp=1]" in reply.transcript
