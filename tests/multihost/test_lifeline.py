"""What runs on a host whose kernel is lost ends by itself, whatever its cells do (issue 35).

The kernel here sees the rehearsal hosts' processes (they are in its PID namespace's children)
and its reaper and stop would kill them by their mark; so these tests watch the hosts without
stopping the session until the ranks there are gone, and the killed kernel runs in a PID
namespace of its own, as a kernel on another machine would.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest

from distnb.errors import RankDiedError
from distnb.rank.lifeline import BOUND_S as LIFELINE_S
from harness.hosts import Host, Lan, missing
from tests.multihost.conftest import start_on
from tests.multihost.test_ssh_faults import fault_in

pytestmark = [
    pytest.mark.multihost,
    pytest.mark.skipif(bool(missing()), reason=f"rehearsal hosts need {missing()}"),
]

# Measured here: a cut host's ranks end 15-17 s after the cut; a killed kernel's in 2-3 s.
GONE_S = LIFELINE_S + 12  # named rather than lingering: the bound, and a busy machine's slack
CELL = """\
import time
x = torch.ones(1)
if rank == 1:
    time.sleep(600)
elif rank == 2:
    while True:
        pass
else:  # rank 3 waits in a collective (across the hosts, through the store) for 1 and 2
    dist.all_reduce(x)
"""


def gone_after(host: Host, since: float, limit: float) -> float:
    """Seconds from `since` until `host` runs no engine, forker or nanny (raises past `limit`)."""
    while running := host.distnb_processes():
        assert time.monotonic() - since < limit, [p.cmdline() for p in running]
        time.sleep(0.2)
    return time.monotonic() - since


def test_ranks_on_a_host_cut_off_end_whatever_their_cell_does(lan: Lan) -> None:
    """Rank 1 sleeps, rank 2 spins in Python, rank 3 waits in a collective: all on h3, whose
    link goes down mid-cell and stays down."""
    h2, h3 = lan.hosts
    s = start_on(lan, {h2.addr: 1, h3.addr: 3})
    try:
        assert len(h3.distnb_processes()) == 7  # 3 engines, their forker, 3 nannies
        cut: list[float] = []
        thread = fault_in(2.0, lambda: (h3.link(up=False), cut.append(time.monotonic())))
        with pytest.raises(RankDiedError, match="left the cluster"):
            s.run(CELL)
        thread.join()
        took = gone_after(h3, cut[0], GONE_S)
        print(f"ranks on the cut host ended {took:.1f} s after the cut")
        assert took < GONE_S
    finally:
        h3.link(up=True)
        s.stop()


KERNEL = """
import json, sys, time
import distnb
hosts, host, ssh_args = json.loads(sys.argv[1])
s = distnb.start(hosts=hosts, host=host, ssh_args=ssh_args, progress=False)
print(json.dumps(s.pids()), flush=True)
s.run("import time\\nwhile True:\\n    pass")
"""


def test_a_killed_kernel_on_another_machine_leaves_nothing_there_or_here(lan: Lan) -> None:
    """The kernel in a PID namespace of its own (its reaper cannot see the hosts' processes,
    as on another machine), killed while its ranks spin in a cell: the ranks end by their
    lifeline, and the kernel's own ssh clients (ipyparallel's waits for each remote engine)
    by its reaper, within seconds."""
    h2 = lan.hosts[0]
    args = json.dumps([{h2.addr: 2}, lan.kernel_addr, lan.ssh_args])
    # `sh` is the namespace's first process, and stays: its end would end the namespace
    inside = f"{sys.executable} -c '{KERNEL}' '{args}' & sleep 600"
    unshared = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c", inside],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert unshared.stdout is not None
        json.loads(unshared.stdout.readline())
        assert len(h2.distnb_processes()) == 5  # 2 engines, their forker, 2 nannies
        (sh,) = psutil.Process(unshared.pid).children()
        (kernel,) = [p for p in sh.children() if p.name() != "sleep"]
        waiters = ssh_waiters(lan)
        assert waiters  # ipyparallel waits on each remote engine over ssh, from the kernel
        time.sleep(1.0)  # the cell is running
        kernel.kill()
        killed = time.monotonic()
        while (ssh_waiters(lan) or left_of(sh)) and time.monotonic() - killed < 10:
            time.sleep(0.1)
        assert not ssh_waiters(lan) and not left_of(sh)  # the reaper's work, here
        took = gone_after(h2, killed, 15)  # the lifeline's, there
        print(f"the killed kernel's ranks ended {took:.1f} s after it")
        assert not list(h2.tmp.glob("distnb-profile-*"))  # and the launcher's profile copy
    finally:
        unshared.kill()  # and with it (--kill-child) `sh`, and the rest of the namespace
        unshared.wait()


def left_of(sh: psutil.Process) -> list[str]:
    """What still runs in the kernel's namespace but its first process (and `sleep`)."""
    alive = []
    for proc in sh.children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.name() != "sleep":
                alive.append(" ".join(proc.cmdline()))
        except psutil.Error:
            pass
    return alive


def ssh_waiters(lan: Lan) -> list[psutil.Process]:
    """ssh clients on this machine waiting on a rehearsal host's engine: ipyparallel's, which
    run the remote Python (`ssh_waitpid`, on its stdin) for each engine, a minute at a time."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        words = proc.info["cmdline"] or []
        if str(lan.key) in words and words[-1] == sys.executable:
            found.append(proc)
    return found
