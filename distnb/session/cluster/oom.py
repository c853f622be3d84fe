"""Whether a rank was killed by the kernel's OOM killer.

A process the OOM killer ends dies by SIGKILL, as one killed by hand or by a scheduler does. Two
pieces of evidence tell them apart, both read on the kernel's host (ranks on other hosts cannot
be told apart): the kernel log names the pid it killed (`Killed process 4242 (python)`, readable
where `dmesg` is), and the `oom_kill` count of the rank's memory cgroup (cgroup v2
`memory.events`, v1 `memory.oom_control`) goes up. `OomBaseline` reads the counts when ranks start,
and the evidence again when one dies; `oom_killed` weighs it (a pure function).
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "OOM_TEXT",
    "OomBaseline",
    "OomEvidence",
    "kernel_log",
    "killed_pids",
    "memory_cgroup",
    "oom_killed",
    "read_oom_kills",
]

OOM_TEXT = "was killed by the OOM killer (its host or memory cgroup ran out of memory)"

# "Memory cgroup out of memory: Killed process 4282 (python) ..." and
# "oom-kill:constraint=CONSTRAINT_MEMCG,...,task=python,pid=4282,uid=0"
_KILLED = re.compile(r"Killed process (\d+)|oom-kill:.*\bpid=(\d+)")
_CGROUP_ROOT = "/sys/fs/cgroup"


@dataclass(frozen=True, slots=True)
class OomEvidence:
    """What the host says about OOM kills: the memory cgroup's `oom_kill` count (None where it
    cannot be read) and the pids the kernel log says the OOM killer killed."""

    oom_kills: int | None = None
    killed_pids: frozenset[int] = frozenset()


def oom_killed(pid: int, exit_code: int | None, before: OomEvidence, after: OomEvidence) -> bool:
    """True when process `pid`, which exited with `exit_code` (negative: killed by that signal;
    None: unknown), was killed by the OOM killer: the kernel log names it, or it died by SIGKILL
    while its cgroup's `oom_kill` count went up from `before` to `after`.

    >>> oom_killed(42, -9, OomEvidence(0), OomEvidence(1))
    True
    >>> oom_killed(42, 1, OomEvidence(0), OomEvidence(1, frozenset({42})))  # it exited itself
    False
    """
    if exit_code is not None and exit_code != -signal.SIGKILL:
        return False
    if pid in after.killed_pids:
        return True
    if before.oom_kills is None or after.oom_kills is None or exit_code is None:
        return False
    return after.oom_kills > before.oom_kills


def killed_pids(lines: Iterable[str]) -> frozenset[int]:
    """The pids that kernel log lines say the OOM killer killed."""
    pids = set()
    for line in lines:
        for match in _KILLED.finditer(line):
            pids.add(int(match.group(1) or match.group(2)))
    return frozenset(pids)


def memory_cgroup(pid: int) -> str | None:
    """The directory of `pid`'s memory cgroup (v2, or v1's memory controller), if readable."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return f"{_CGROUP_ROOT}/memory{path}"
    for line in lines:
        if line.startswith("0::"):
            return f"{_CGROUP_ROOT}{line[3:]}"
    return None


def read_oom_kills(cgroup: str | None) -> int | None:
    """The `oom_kill` count of a memory cgroup directory, or None."""
    if cgroup is None:
        return None
    for name in ("memory.events", "memory.oom_control"):
        try:
            with open(os.path.join(cgroup, name)) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


def kernel_log() -> list[str]:
    """The kernel's log lines about OOM kills (from /dev/kmsg), or [] where it cannot be read
    (reading it needs CAP_SYSLOG where `kernel.dmesg_restrict` is 1)."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return []
    lines = []
    try:
        while True:
            try:
                record = os.read(fd, 8192).decode(errors="replace")
            except BlockingIOError:
                break  # read to the end
            except BrokenPipeError:
                continue  # the record was overwritten while we read: go on with the next
            except OSError:
                break
            if not record:
                break
            if "Killed process" in record or "oom-kill" in record:
                lines.append(record.split(";", 1)[-1].rstrip("\n"))
    finally:
        os.close(fd)
    return lines


class OomBaseline:
    """The OOM evidence of a session's local ranks: counts when made, weighed at a death.

    >>> baseline = OomBaseline([4242, 4244])   # when the ranks start
    >>> baseline.killed(4244, exit_code=-9)    # when rank 1 died by SIGKILL
    True
    """

    def __init__(self, pids: Sequence[int]) -> None:
        self._cgroups = {pid: memory_cgroup(pid) for pid in pids}
        self._before = {pid: OomEvidence(read_oom_kills(cg)) for pid, cg in self._cgroups.items()}

    def killed(self, pid: int, exit_code: int | None) -> bool:
        """Whether the OOM killer killed `pid` (which exited with `exit_code`, if known)."""
        if exit_code is not None and exit_code != -signal.SIGKILL:
            return False  # not worth reading the kernel log
        after = OomEvidence(read_oom_kills(self._cgroups.get(pid)), killed_pids(kernel_log()))
        return oom_killed(pid, exit_code, self._before.get(pid, OomEvidence()), after)
