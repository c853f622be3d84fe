"""The debugger on the ranks, driven from a real Jupyter kernel as a user drives it.

A frontend (`harness.kernel_driver`) answers the kernel's input requests the way a user types into
JupyterLab's input box; every cell runs on a real 2-rank gloo cluster started once for this
module. Each test ends with the cluster ready for the next cell.
"""

from __future__ import annotations

import re
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from distnb.session.load import stretched
from harness.kernel_driver import Frontend, Reply, with_ranks

pytestmark = pytest.mark.cluster

CELL = re.compile(r"cell In\[(\d+)\]")


@pytest.fixture(scope="module")
def fe() -> Iterator[Frontend]:
    with with_ranks() as fe:
        yield fe


def cell_number(reply: Reply) -> int:
    return int(reply.content["execution_count"])


def said(reply: Reply, rank: int, line: str) -> bool:
    """The rank printed exactly `line`: a line of its own labelled output, or one it shares with
    other ranks (`[ranks 0-1] line`)."""
    for shown in reply.text.splitlines():
        label, _, text = shown.partition("] ")
        if text == line and label.startswith("[rank") and rank in ranks_of(label[1:]):
            return True
    return False


def ranks_of(label: str) -> set[int]:
    """`rank 1` -> {1}; `ranks 0-2,5` -> {0, 1, 2, 5}."""
    found: set[int] = set()
    for part in label.split(" ", 1)[-1].split(","):
        first, _, last = part.partition("-")
        found.update(range(int(first), int(last or first) + 1))
    return found


def still_works(fe: Frontend) -> None:
    """The next cell runs on the same process group."""
    code = "%%allranks\nx = torch.ones(1) * (rank + 1)\ndist.all_reduce(x)\nprint(x.item())"
    reply = fe.run(code)
    if reply.status == "aborted":  # ipykernel aborts a request that reaches it right after an
        # error, until its own "stop aborting" message passes (a loaded machine): send it again
        reply = fe.run(code)
    assert reply.status == "ok", reply.text
    assert "[ranks 0-1] 3.0" in reply.text


def test_breakpoint_stops_one_rank_with_its_prompt_in_the_notebook(fe: Frontend) -> None:
    code = """\
        %%allranks
        x = rank * 10
        if rank == 1:
            breakpoint()
        y = x + 1
        print('done', rank, y)"""
    reply = fe.run(textwrap.dedent(code), ["p x", "w", "n", "p y", "c"])
    n = cell_number(reply)
    assert reply.status == "ok", reply.text
    assert reply.prompts == ["[rank 1] (Pdb) "] * 5
    text = reply.text
    # the stop is at the cell's next line, named as the notebook names it
    assert f"[rank 1] > cell In[{n}] line 5, in <module>()\n[rank 1] -> y = x + 1" in text
    assert said(reply, 1, "10")  # p x
    assert said(reply, 1, "11")  # p y, after n
    assert f"[rank 1] > cell In[{n}] line 6, in <module>()" in text
    # w starts at the user's code: no IPython, ipykernel, ipyparallel or distnb frames
    assert "ipykernel" not in text and "site-packages" not in text and "distnb/" not in text
    assert "[rank 0] done 0 1" in text and "[rank 1] done 1 11" in text
    assert f"distnb: rank 1 stopped at cell In[{n}] line 5" in text


def test_every_pdb_command(fe: Frontend) -> None:
    code = """\
        %%allranks
        def scale(v, k):
            w = v * k
            return w
        if rank == 0:
            breakpoint()
        out = scale(2, 3)
        print('out', out)"""
    answers = [
        "l",  # the lines around
        "b scale",  # a breakpoint on a function of the cell
        "s",  # into scale: --Call--
        "n",
        "n",
        "pp {'w': w}",
        "u",
        "p rank",
        "d",
        "ll",
        "interact",
        "print('inside', v + k)",
        "exit()",
        "r",  # to scale's return
        "c",
    ]
    reply = fe.run(textwrap.dedent(code), answers)
    n = cell_number(reply)
    assert reply.status == "ok", reply.text
    text = reply.text
    assert f"Breakpoint 1 at cell In[{n}] line 2" in text
    assert f"[rank 0] > cell In[{n}] line 3, in scale()" in text
    assert "[rank 0] {'w': 6}" in text
    assert said(reply, 0, "0")  # p rank, one frame up
    assert "[rank 0] inside 5" in text  # interact's interpreter, left with exit()
    assert "[rank 0] --Return--" in text
    assert said(reply, 0, "out 6") and said(reply, 1, "out 6")
    assert reply.prompts.count("[rank 0] >>> ") == 2


@pytest.mark.parametrize(
    "stop",
    [
        "import pdb; pdb.set_trace()",
        "import pdb; pdb.Pdb().set_trace()",
        "import ipdb; ipdb.set_trace()",
    ],
)
def test_pdb_and_ipdb_stop_a_rank(fe: Frontend, stop: str) -> None:
    pytest.importorskip("ipdb") if "ipdb" in stop else None
    code = f"%%allranks\nz = 3\nif rank == 1:\n    {stop}\nz += rank\nprint('z', z)"
    reply = fe.run(code, ["p z", "c"])
    assert reply.status == "ok", reply.text
    assert reply.prompts[0].startswith("[rank 1] ")
    assert said(reply, 1, "3") and "[rank 1] z 4" in reply.text


def test_torch_distributed_breakpoint_keeps_the_others_at_its_barrier(fe: Frontend) -> None:
    code = "%%allranks\nmark = rank\ndist.breakpoint(rank=1)\nprint('after', rank)"
    reply = fe.run(code, ["ranks", "n", "p mark", "c"])
    n = cell_number(reply)
    assert reply.status == "ok", reply.text
    text = reply.text
    # rank 1 stops at the user's line, before the barrier: rank 0 waits there
    assert f"[rank 1] > cell In[{n}] line 3, in <module>()" in text
    assert re.search(r"rank 0: waiting at barrier #\d+ on WORLD", text), text
    # n steps to the next line of the cell, not into the barrier
    assert f"[rank 1] > cell In[{n}] line 4, in <module>()" in text
    assert "[rank 0] after 0" in text and "[rank 1] after 1" in text


def test_cells_on_some_ranks(fe: Frontend) -> None:
    # torch.distributed.breakpoint with nobody else running the cell: nothing to wait for
    reply = fe.run("%%allranks --ranks 1\ndist.breakpoint(rank=1)\nprint('after')", ["c"])
    assert reply.status == "ok" and "[rank 1] after" in reply.text, reply.text
    # a collective that needs a rank outside the cell says so at once, instead of a hang
    reply = fe.run("%%allranks --ranks 1\nx = torch.ones(1)\ndist.all_reduce(x)")
    assert reply.content["ename"] == "CollectiveDesyncError"
    assert "rank 0 does not run the cell (it runs on rank 1 only), so all_reduce #" in reply.text
    still_works(fe)


def test_input_on_ranks_asks_the_user(fe: Frontend) -> None:
    reply = fe.run("%%allranks\nname = input('name? ')\nprint('hello', name)", ["zero", "one"])
    assert reply.status == "ok", reply.text
    assert reply.prompts == ["[rank 0] name? ", "[rank 1] name? "]
    assert "[rank 0] hello zero" in reply.text and "[rank 1] hello one" in reply.text


def test_getpass_on_a_rank_asks_with_hidden_input(fe: Frontend) -> None:
    code = "%%allranks --ranks 1\nimport getpass\ntoken = getpass.getpass('token: ')\nlen(token)"
    reply = fe.run(code, ["s3cret"])
    assert reply.status == "ok" and reply.prompts == ["[rank 1] token: "]
    assert "[rank 1] 6" in reply.text and "s3cret" not in reply.text
    assert fe.last_password  # the frontend was asked to hide it


def test_time_in_the_debugger_is_not_the_cells(fe: Frontend) -> None:
    limit = stretched(2.0, 20.0)  # the cell's own time, outside the prompt, on a loaded machine

    def slowly(line: str) -> object:
        def answer(prompt: str) -> str:
            time.sleep(limit + 0.5)  # past the cell's timeout
            return line

        return answer

    code = f"%%allranks --timeout {limit:.1f}\nx = torch.ones(2)\nif rank == 1:\n    breakpoint()\n"
    reply = fe.run(code + "dist.all_reduce(x)\nprint(x)", [slowly("p x"), "c"])
    assert reply.status == "ok", reply.text
    assert "RankTimeoutError" not in reply.text
    assert said(reply, 0, "tensor([2., 2.])") and said(reply, 1, "tensor([2., 2.])")


def test_quitting_releases_the_peer_waiting_at_a_collective(fe: Frontend) -> None:
    quit_at: list[float] = []

    def quit_now(prompt: str) -> str:
        quit_at.append(time.monotonic())
        return "q"

    code = """\
        %%allranks
        import time
        x = torch.ones(2)
        if rank == 1:
            breakpoint()
        try:
            dist.all_reduce(x)
        finally:
            print('left', rank, repr(time.monotonic()))"""
    reply = fe.run(textwrap.dedent(code), [quit_now])
    n = cell_number(reply)
    assert reply.status == "error" and reply.content["ename"] == "RankError"
    text = reply.text
    assert f"cell In[{n}] failed on rank 1: DebuggerQuit: rank 1 quit the debugger" in text
    assert f"rank 1 quit the debugger at cell In[{n}] line 6 without calling all_reduce" in text
    assert "DebuggerQuit: rank 1 quit the debugger" in text
    assert "debugger.py" not in text  # distnb's frames stay out of the traceback
    released = float(re.search(r"\[rank 0\] left 0 ([\d.]+)", text).group(1))  # type: ignore[union-attr]
    print(f"rank 0 released {released - quit_at[0]:.3f} s after q")
    assert released - quit_at[0] < 2.0
    still_works(fe)


def test_several_stopped_ranks_take_turns(fe: Frontend) -> None:
    code = "%%allranks\nx = torch.ones(2)\nbreakpoint()\ndist.all_reduce(x)\nprint(rank, x)"
    answers = ["n", "ranks", "rank 1", "p rank", "c", "p rank", "c"]
    reply = fe.run(code, answers)
    n = cell_number(reply)
    assert reply.status == "ok", reply.text
    # rank 0 first; its n waits for rank 1 at all_reduce, so rank 1 gets the prompt
    assert reply.prompts[:2] == ["[rank 0] (Pdb) ", "[rank 1] (Pdb) "]
    text = reply.text
    assert f"distnb: rank 0 stopped at cell In[{n}] line 4; also stopped: 1" in text
    assert re.search(r"rank 0: waiting at all_reduce #\d+ on WORLD .* for rank 1", text), text
    assert f"rank 1: stopped in the debugger at cell In[{n}] line 4 (this prompt)" in text
    assert said(reply, 1, "1") and said(reply, 0, "0")
    assert "[ranks 0-1]" in text or ("[rank 0] 0 tensor" in text and "[rank 1] 1 tensor" in text)


def test_switching_to_a_rank_that_runs_says_so(fe: Frontend) -> None:
    code = "%%allranks\nif rank == 0:\n    breakpoint()\nprint('end', rank)"
    reply = fe.run(code, ["rank 1", "c"])
    assert reply.status == "ok", reply.text
    assert "distnb: rank 1 is not stopped" in reply.text


def test_an_interrupt_at_the_prompt_quits_that_rank(fe: Frontend) -> None:
    code = "%%allranks\nx = torch.ones(2)\nif rank == 0:\n    breakpoint()\ndist.all_reduce(x)"
    reply = fe.run(code, [lambda prompt: None])  # the user interrupts the kernel
    assert reply.status == "error"
    assert "distnb: interrupted: rank 0 leaves the debugger" in reply.text
    assert "rank 0 quit the debugger" in reply.text
    still_works(fe)


def test_post_mortem_opens_the_failing_frame(fe: Frontend) -> None:
    code = """\
        %%allranks
        def f(a):
            b = torch.full((2,), float(a))
            raise ValueError(f'bad {b.sum()}')
        if rank == 1:
            f(rank)
        dist.barrier()"""
    failed = fe.run(textwrap.dedent(code))
    n = cell_number(failed)
    assert failed.status == "error"
    reply = fe.run("%dist_debug", ["p b", "w", "u", "p rank", "q"])
    assert reply.status == "ok", reply.text
    text = reply.text
    assert reply.prompts[0] == "[rank 1] (Pdb) "  # the rank that raised, not its peer
    assert "[rank 1] ValueError: bad 2.0" in text
    assert f"[rank 1] > cell In[{n}] line 4, in f()" in text
    assert "[rank 1] tensor([1., 1.])" in text
    assert f"[rank 1]   cell In[{n}] line 6, in <module>()" in text
    # the rank keeps its traceback: again, on the peer this time, and through %debug
    reply = fe.run("%dist_debug 0", ["q"])
    assert "[rank 0] CollectiveDesyncError" in reply.text
    reply = fe.run("%debug", ["p a", "q"])
    assert reply.prompts == ["[rank 1] (Pdb) "] * 2 and said(reply, 1, "1")
    # a rank that did not fail, or a run that did not fail
    reply = fe.run("%dist_debug 5")
    assert reply.status == "error" and "rank 5 did not fail in the last run" in reply.text
    still_works(fe)
    reply = fe.run("%dist_debug")
    assert reply.status == "error" and "nothing to debug" in reply.text


def test_debug_after_a_kernel_error_is_ipythons_own(fe: Frontend) -> None:
    fe.run("kernel_side = 7\n1 / 0")
    reply = fe.run("%debug", ["p kernel_side", "q"])
    assert reply.prompts == ["ipdb> ", "ipdb> "] and "7" in reply.text


def test_post_mortem_of_a_mismatch_starts_at_the_users_line(fe: Frontend) -> None:
    failed = fe.run("%%allranks\nx = torch.zeros(3 + rank)\ndist.all_reduce(x)")
    n = cell_number(failed)
    assert failed.content["ename"] == "CollectiveMismatchError"
    reply = fe.run("%dist_debug 1", ["p x.shape", "q"])
    assert f"[rank 1] > cell In[{n}] line 3, in <module>()" in reply.text
    assert "[rank 1] torch.Size([4])" in reply.text


def test_pdb_on_and_dist_pdb_on_open_the_failed_rank(fe: Frontend) -> None:
    failing = "%%allranks\nq = 5 + rank\nassert rank == 0, 'rank 1 is off'"
    for magic in ("%pdb", "%dist_pdb"):
        fe.run(f"{magic} on")
        try:
            reply = fe.run(failing, ["p q", "q"])
        finally:
            fe.run(f"{magic} off")
        assert reply.prompts == ["[rank 1] (Pdb) "] * 2 and said(reply, 1, "6"), magic
        assert reply.content["ename"] == "RankError" and "RankError" in reply.text
    # the Python equivalents
    fe.run(failing)
    reply = fe.run(
        "from distnb.magics import DistMagics\n"
        "m = next(m for m in get_ipython().magics_manager.registry.values()"
        " if isinstance(m, DistMagics))\n"
        "m.session.debug(1)",
        ["p q", "q"],
    )
    assert reply.status == "ok" and said(reply, 1, "6")


def test_a_frontend_without_stdin_skips_breakpoints(fe: Frontend) -> None:
    code = "%%allranks\nbreakpoint()\nimport pdb; pdb.set_trace()\nprint('ran', rank)"
    reply = fe.run(code, allow_stdin=False)
    n = cell_number(reply)
    assert reply.status == "ok", reply.text
    assert reply.text.count(f"breakpoint at cell In[{n}] line 2 skipped: this frontend") == 2
    assert "[rank 1] ran 1" in reply.text
    reply = fe.run("%%allranks\nname = input('name? ')", allow_stdin=False)
    assert reply.status == "error" and "input() at cell In" in reply.text
    still_works(fe)


def test_a_breakpoint_in_a_module_a_script_imports(fe: Frontend, tmp_path: Path) -> None:
    (tmp_path / "helper.py").write_text(
        "def step(rank):\n    loss = rank + 0.5\n    breakpoint()\n    return loss\n"
    )
    (tmp_path / "train.py").write_text(
        "import torch.distributed as dist\nfrom helper import step\n\n"
        "def main():\n    dist.init_process_group('gloo')\n    r = dist.get_rank()\n"
        "    print('loss', step(r) if r == 1 else 0.0)\n    dist.barrier()\n\nmain()\n"
    )
    reply = fe.run(f"%dist_run {tmp_path / 'train.py'}", ["p loss", "w", "c"])
    assert reply.status == "ok", reply.text
    text = reply.text
    assert f"[rank 1] > {tmp_path / 'helper.py'}:4, in step()" in text
    assert "[rank 1] 1.5" in text
    # w: the script, its main(), the module; nothing of the engine or distnb below it
    assert f"{tmp_path / 'train.py'}:10, in <module>()" in text
    assert "ipykernel" not in text and "distnb/" not in text
    assert "[rank 1] loss 1.5" in text


def test_ctrl_c_on_a_waiting_cell_says_where_each_rank_was(fe: Frontend) -> None:
    # each rank says "here" on the line where it then waits: a rank whose "here" came may still
    # be inside its print (a loaded machine), and where it is must be that line all the same
    code = """\
        %%allranks
        import time
        x = torch.ones(1)
        if rank == 1:
            print('here', flush=True); time.sleep(60)
        print('here', flush=True); dist.all_reduce(x)"""
    msg_id = fe.kc.execute(textwrap.dedent(code))
    seen = ""
    while "[rank 0] here" not in seen or "[rank 1] here" not in seen:
        msg = fe.kc.get_iopub_msg(timeout=30)
        if msg["parent_header"].get("msg_id") == msg_id:
            seen += msg["content"].get("data", {}).get("text/plain", "")
    fe.km.interrupt_kernel()
    reply = fe.kc.get_shell_msg(timeout=30)["content"]
    assert reply["ename"] == "CellInterrupted"  # a KeyboardInterrupt that says where
    evalue = reply["evalue"]
    # waiting at the all_reduce (its beacon), or on its way there (its stack)
    at = r"waiting at all_reduce #\d+ on WORLD|at cell In\[\d+\] line 6: print.*all_reduce\(x\)"
    assert re.search(rf"rank 0 ({at})", evalue), evalue
    assert re.search(r"rank 1 at cell In\[\d+\] line 5: print.*time.sleep\(60\)", evalue), evalue
    assert reply["traceback"] == [f"KeyboardInterrupt: {evalue}"]  # no distnb internals
    still_works(fe)
