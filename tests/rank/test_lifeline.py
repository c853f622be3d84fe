"""A rank's lifeline (`distnb.rank.lifeline`): it ends the rank's process and everything below
it once the kernel's control plane is gone, whatever the main thread does, and never while the
port answers. Real sockets and real processes; the kernel's side is a listening socket here."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from distnb.rank import lifeline
from distnb.rank.lifeline import Lifeline

BOUND_S = 15.0  # named rather than hanging: refusals end a rank in about 2 s


@pytest.fixture
def port() -> Iterator[socket.socket]:
    listening = socket.create_server(("127.0.0.1", 0))
    yield listening
    listening.close()


def ended_after(line: Lifeline) -> tuple[threading.Event, list[str]]:
    ended, reasons = threading.Event(), []
    line._end = lambda reason: (reasons.append(reason), ended.set())
    line.start()
    return ended, reasons


def test_a_lifeline_ends_its_rank_once_the_port_refuses(
    port: socket.socket, tmp_path: Path
) -> None:
    """The kernel is gone for good: the session's profile folder the engine ran in goes too."""
    folder = tmp_path / "distnb-profile-abc"
    (folder / "security").mkdir(parents=True)
    line = Lifeline(3, port.getsockname()[:2], silence_s=60, leftover=str(folder))
    ended, reasons = ended_after(line)
    assert not ended.wait(lifeline.PROBE_S * 2.5)  # the port answers: the rank lives
    assert folder.exists()
    port.close()
    assert ended.wait(BOUND_S)
    assert not folder.exists()
    assert reasons == [
        f"rank 3: the kernel's control plane at 127.0.0.1:{line.address[1]} refuses connections"
    ]


def test_a_lifeline_ends_its_rank_after_the_silence_of_a_lost_link(tmp_path: Path) -> None:
    """A port whose queue is full drops new connections without a word, as a host cut off
    does (a refusal, by contrast, is an answer). The kernel may live on the other side of the
    cut: its folder stays."""
    full = socket.create_server(("127.0.0.1", 0), backlog=0)
    waiting = [socket.socket() for _ in range(3)]
    try:
        for s in waiting:
            s.setblocking(False)
            s.connect_ex(full.getsockname())
        line = Lifeline(0, full.getsockname()[:2], silence_s=2.0, leftover=str(tmp_path))
        ended, reasons = ended_after(line)
        assert ended.wait(BOUND_S)
        assert "has not answered for" in reasons[0] and tmp_path.exists()
    finally:
        for s in [*waiting, full]:
            s.close()


def test_a_stopped_lifeline_ends_nothing(port: socket.socket) -> None:
    line = Lifeline(0, port.getsockname()[:2])
    ended, _ = ended_after(line)
    line.stop()
    port.close()
    assert not ended.wait(lifeline.PROBE_S * 3)


# A rank's process: its lifeline, a child (as a nanny or a cell's subprocess is), and a main
# thread busy as a cell can be.
RANK = """
import json, subprocess, sys, time
from distnb.rank.lifeline import Lifeline
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
Lifeline(1, ("127.0.0.1", int(sys.argv[1]))).start()
print(json.dumps(child.pid), flush=True)
if sys.argv[2] == "sleep":
    time.sleep(600)
else:
    while True:
        pass
"""


@pytest.mark.parametrize("busy", ["sleep", "loop"])
def test_a_rank_busy_in_its_cell_ends_with_its_children_when_its_kernel_goes(
    port: socket.socket, busy: str
) -> None:
    rank = subprocess.Popen(
        [sys.executable, "-c", RANK, str(port.getsockname()[1]), busy],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert rank.stdout is not None
        child = psutil.Process(json.loads(rank.stdout.readline()))
        time.sleep(lifeline.PROBE_S * 2)
        assert rank.poll() is None and child.is_running()  # the kernel is there
        started = time.monotonic()
        port.close()
        rank.wait(BOUND_S)
        assert time.monotonic() - started < BOUND_S
        child.wait(5)  # SIGKILLed before its parent
        assert rank.stderr is not None
        said = rank.stderr.read()
        assert "rank 1: the kernel's control plane at 127.0.0.1" in said
        assert "ending this engine, its nanny and their children" in said
    finally:
        rank.kill()
        rank.wait()
