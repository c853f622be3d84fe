"""The text debugger's transcript as a notebook frontend receives it, in order: the rank's
output, then each prompt with the line typed and its answer, as they happened (a real kernel and
a real 2-rank cluster; `Reply.transcript` puts each answered prompt where the notebook shows it).
"""

from __future__ import annotations

import re
import textwrap
import time
from collections.abc import Iterator

import pytest

from harness.kernel_driver import Frontend, with_ranks

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def fe() -> Iterator[Frontend]:
    with with_ranks() as fe:
        yield fe


def in_order(text: str, *parts: str) -> None:
    position = 0
    for part in parts:
        found = text.find(part, position)
        assert found >= 0, f"expected {part!r} after {position} (in order {parts}):\n{text}"
        position = found + len(part)


def test_each_command_and_its_answer_follow_each_other(fe: Frontend) -> None:
    code = """\
        %%allranks
        x = torch.ones(2)
        print('before', rank)
        if rank == 1:
            breakpoint()
        dist.all_reduce(x)
        print('after', rank, x)"""
    reply = fe.run(textwrap.dedent(code), ["p x", "n", "p x", "c"])
    n = reply.content["execution_count"]
    assert reply.status == "ok", reply.transcript
    in_order(
        reply.transcript,
        "[rank 1] before 1",
        f"[rank 1] > cell In[{n}] line 6, in <module>()",
        f"distnb: rank 1 stopped at cell In[{n}] line 6",
        "[rank 1] (Pdb) p x",
        "[rank 1] tensor([1., 1.])",
        "[rank 1] (Pdb) n",
        f"[rank 1] > cell In[{n}] line 7, in <module>()",
        "[rank 1] (Pdb) p x",
        "[rank 1] tensor([2., 2.])",  # after the all_reduce, below the command that asked
        "[rank 1] (Pdb) c",
        "[rank 1] after 1 tensor([2., 2.])",
    )
    # rank 0 goes on once rank 1's n has taken it through the all_reduce: said there
    in_order(reply.transcript, "[rank 1] (Pdb) n", "[rank 0] after 0 tensor([2., 2.])")
    assert reply.transcript.count("[rank 1] tensor([2., 2.])") == 1  # nothing printed twice


def test_a_command_to_every_stopped_rank_answers_in_one_block(fe: Frontend) -> None:
    code = "%%allranks\nloss = torch.tensor(0.5)\nbreakpoint()\nprint('done', rank)"
    reply = fe.run(code, ["ranks all p loss", "ranks all p rank", "ranks all c"])
    assert reply.status == "ok", reply.transcript
    assert reply.prompts == ["[rank 0] (Pdb) "] * 3  # one prompt, not one per rank
    in_order(
        reply.transcript,
        "[rank 0] (Pdb) ranks all p loss",
        "[ranks 0-1] tensor(0.5000)",
        "[rank 0] (Pdb) ranks all p rank",
        "[rank 0] 0\n[rank 1] 1",
        "[rank 0] (Pdb) ranks all c",
        "distnb: ranks 0-1 go on (c)",
        "done",
    )
    assert "[rank 1] (Pdb)" not in reply.transcript


def test_time_at_a_prompt_is_stopped_in_the_timeline_not_waiting(fe: Frontend) -> None:
    def slowly(prompt: str) -> str:
        time.sleep(1.5)  # the user reads; rank 0 waits at the all_reduce meanwhile
        return "c"

    code = "%%allranks\nx = torch.ones(2)\nif rank == 1:\n    breakpoint()\ndist.all_reduce(x)"
    assert fe.run(code, [slowly]).status == "ok"
    text = fe.run("%dist_timeline --cells 1").text
    stopped = re.search(r"Stopped in a debugger: rank 1, ([\d.]+) s", text)
    assert stopped is not None and float(stopped.group(1)) >= 1.5, text  # the user's 1.5 s
    lines = text.splitlines()
    table = lines[lines.index("Stragglers (arrived last; the others' wait for it):") + 2 :][:2]
    rows = {cells[0]: cells for cells in (re.split(r"\s{2,}", line.strip()) for line in table)}
    # rank 1 caused no wait of its own, rank 0 waited for no straggler: both well under 1 s
    assert rows["1"][2].endswith(("ns", "µs", "ms")), text  # others' wait caused
    assert rows["0"][3].endswith(("ns", "µs", "ms")), text  # own wait
    assert rows["1"][4] == f"{stopped.group(1)} s", text  # stopped, as the summary says
