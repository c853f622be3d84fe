"""Ctrl-C where the kernel holds it (`distnb.interrupts`): noted, raised where the code
asks, let through at a prompt; and while a session starts: the kernel's import of torch stays
whole, the start says in one line that it was interrupted and left nothing running, and the next
`%dist_start` works.

Each case runs in a fresh interpreter (this one imported torch long ago), and Ctrl-C (SIGINT,
as a terminal and Jupyter's interrupt send it) comes half-way through torch's import, once
`torch.nn` is loaded: cut there, a plain import leaves `torch` half initialised for good (every
later import: "partially initialized module 'torch' has no attribute 'cuda'"; cut at its first
line, torch's import is simply undone)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

# Sends SIGINT to its own process half-way through torch's import.
INTERRUPT_IN_TORCH_IMPORT = """
import os, signal, sys, threading, time
def _fire():
    while "torch.nn" not in sys.modules:
        time.sleep(0.0005)
    os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=_fire, daemon=True).start()
"""


def run(code: str, prelude: str = INTERRUPT_IN_TORCH_IMPORT, timeout_s: float = 300) -> str:
    """What `code` printed, run in a fresh interpreter after `prelude` (which interrupts it)."""
    script = prelude + textwrap.dedent(code)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout_s
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr  # IPython shows a UsageError on stderr


def test_an_interrupted_import_of_torch_is_finished_then_raised() -> None:
    out = run(
        """
        from distnb.interrupts import import_whole
        try:
            import_whole("torch.distributed")
            print("not interrupted")
        except KeyboardInterrupt as exc:
            print("interrupted:", exc)
        import torch.distributed as dist
        print("whole:", dist.is_available() and hasattr(dist, "TCPStore"))
        """
    )
    assert out.splitlines() == [
        "interrupted: interrupted while importing torch.distributed (the import was finished)",
        "whole: True",
    ]


def test_a_held_interrupt_is_raised_where_the_code_asks_and_a_prompt_lets_it_through() -> None:
    from distnb import interrupts

    before = signal.getsignal(signal.SIGINT)
    with interrupts.held() as noted:
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs before kill returns
        assert noted.count == 1  # noted, not raised
        with pytest.raises(KeyboardInterrupt):
            noted.check()
        noted.check()  # raised once
        with pytest.raises(KeyboardInterrupt), interrupts.let_through():
            os.kill(os.getpid(), signal.SIGINT)  # a prompt's input(): Ctrl-C raises there
            time.sleep(5)
        os.kill(os.getpid(), signal.SIGINT)  # held again after the prompt
        assert noted.count == 1
    assert signal.getsignal(signal.SIGINT) is before


def test_inside_another_held_block_the_outermost_decides_when_to_raise() -> None:
    """A step that must be whole (posting a request) inside a command that must be whole
    (stopping ranks and holding their peers): the inner block's interrupt is the outer's."""
    from distnb import interrupts

    with interrupts.held() as outer:
        with interrupts.held() as inner:
            os.kill(os.getpid(), signal.SIGINT)
            assert inner.count == 1
        inner.check()  # no longer its own: nothing raised here
        assert (inner.count, outer.count) == (0, 1)
        with pytest.raises(KeyboardInterrupt):
            outer.check()


@pytest.mark.cluster
def test_ctrl_c_in_dist_start_leaves_a_kernel_that_starts_the_next_time() -> None:
    out = run(
        """
        import psutil
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.run_line_magic("load_ext", "distnb")
        ip.run_cell("%dist_start -n 2")
        print("left running:", len(psutil.Process().children(recursive=True)))
        ip.run_cell("%dist_start -n 2")
        ip.run_cell("%%allranks\\nprint('rank', rank, 'of', world_size)")
        ip.run_cell("%dist_stop")
        print("left after stop:", len(psutil.Process().children(recursive=True)))
        """
    )
    lines = out.splitlines()
    said = [line for line in lines if "interrupted" in line]
    assert said == [
        "UsageError: %dist_start was interrupted: nothing is left running; %dist_start starts again"
    ], out
    assert "left running: 0" in lines, out
    assert "[rank 0] rank 0 of 2" in lines and "[rank 1] rank 1 of 2" in lines, out
    assert "left after stop: 0" in lines, out
    assert not [p for p in psutil.Process().children(recursive=True) if "ipengine" in str(p)]


# Sends SIGINT to its own process as `Cluster.<method>` starts, while the line that called it
# runs: the interrupt comes at that phase of a command, as a Ctrl-C would.
INTERRUPT_AT = """
import os, signal
from distnb.session.cluster.launch import Cluster

def interrupt_at(method):
    original = getattr(Cluster, method)
    def interrupted(self, *args, **kwargs):
        setattr(Cluster, method, original)  # once
        os.kill(os.getpid(), signal.SIGINT)
        return original(self, *args, **kwargs)
    setattr(Cluster, method, interrupted)
"""


def test_ctrl_c_in_dist_stop_and_dist_restart_leaves_nothing_running_and_says_so() -> None:
    """Ctrl-C while the cluster stops waits for the stop (one cut half-way leaves processes);
    while a restart starts the new cluster, it ends what had begun: either way one line says
    what happened, nothing is left running and the next %dist_start works."""
    out = run(
        """
        import psutil
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.run_line_magic("load_ext", "distnb")
        ip.run_cell("%dist_start -n 2")
        interrupt_at("stop")
        ip.run_cell("%dist_stop")
        print("left after stop:", len(psutil.Process().children(recursive=True)))
        ip.run_cell("%dist_start -n 2")
        interrupt_at("wait_registered")
        ip.run_cell("%dist_restart")
        print("left after restart:", len(psutil.Process().children(recursive=True)))
        ip.run_cell("%dist_start -n 2")
        ip.run_cell("%%allranks\\nprint('rank', rank, 'of', world_size)")
        ip.run_cell("%dist_stop")
        print("left at the end:", len(psutil.Process().children(recursive=True)))
        """,
        prelude=INTERRUPT_AT,
    )
    lines = out.splitlines()
    assert (
        "distnb: Ctrl-C came while the cluster stopped: the stop finished first (a stop cut "
        "half-way would leave processes running)"
    ) in lines, out
    assert "left after stop: 0" in lines, out
    assert (
        "UsageError: %dist_restart was interrupted while the new cluster started: the old one "
        "was stopped and nothing is left running; %dist_start starts again"
    ) in lines, out
    assert "left after restart: 0" in lines, out
    assert "[rank 0] rank 0 of 2" in lines and "[rank 1] rank 1 of 2" in lines, out
    assert "left at the end: 0" in lines, out


# Sends SIGINT to its own process once a file appears: a rank's cell code writes it when it
# begins what the interrupt must cut.
INTERRUPT_WHEN_TOLD = """
import os, signal, tempfile, threading, time
told = os.path.join(tempfile.mkdtemp(), "told")
def _fire():
    while True:
        while not os.path.exists(told):
            time.sleep(0.01)
        os.remove(told)
        os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=_fire, daemon=True).start()
"""


@pytest.mark.cluster
def test_ctrl_c_in_dist_diff_watch_sets_the_watch_on_no_rank_and_says_so() -> None:
    """A watch on some ranks only would report replicas that differ: Ctrl-C while it is set
    removes it from every rank, and one line says so; a tool cut while a rank is slow says
    where it had finished. The cluster stays usable, and the watch works when run again."""
    out = run(
        """
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.run_line_magic("load_ext", "distnb")
        ip.run_cell("%dist_start -n 2")
        ip.run_cell('''%%allranks
        import time, torch
        told = TOLD
        class Lazy:  # a model built on first use, slowly on rank 1
            def __init__(self):
                self._model = torch.nn.Linear(2, 2)
            @property
            def model(self):
                if rank == 1:
                    open(told, "w").close()
                    time.sleep(120)
                return self._model
        holder = Lazy()
        '''.replace("TOLD", repr(told)))
        ip.run_cell("%dist_diff holder.model --watch")
        ip.run_cell("%%allranks\\nfrom distnb.rank.replicas import watch\\nprint(watch.watching())")
        ip.run_cell("%dist_shapes holder.model")
        ip.run_cell("%%allranks\\ndel Lazy.model; holder.model = holder._model")
        ip.run_cell("%dist_diff holder.model --watch")
        ip.run_cell("%%allranks\\nprint('watching', watch.watching())")
        ip.run_cell("%%allranks\\nprint('usable on', rank)")
        ip.run_cell("%dist_stop")
        """,
        prelude=INTERRUPT_WHEN_TOLD,
    )
    lines = out.splitlines()
    assert (
        "KeyboardInterrupt: %dist_diff --watch was interrupted: no rank watches holder.model; "
        "run it again"
    ) in lines, out
    assert "[ranks 0-1] []" in lines, out  # no rank watches it
    assert (
        "KeyboardInterrupt: distnb interrupted rank 1, which had not answered (rank 0 had); "
        "the cluster is usable"
    ) in lines, out  # %dist_shapes
    assert "[ranks 0-1] watching ['holder.model']" in lines, out  # run again, it works
    assert "[rank 0] usable on 0" in lines and "[rank 1] usable on 1" in lines, out
