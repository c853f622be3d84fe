"""What the death of a cluster's process means, in words: the session's reason to stop, and the
report of a rank that died (what it last said, where it died).

The session looks for dead members (`distnb.session.cluster.members`) while a cell runs and
before each cell, so the death of any vital one is named at once with what it means and what to
run, instead of a cell that hangs.

A rank that dies writes its last words to its log file: what the cell printed (engines echo
it there), gloo's or NCCL's abort reason (`terminate called after throwing an instance of
'gloo::EnforceNotMet'`) and, from `faulthandler`, the Python stack it died in. `death_report`
takes the part of the log written since the cell started and turns it into the report.
"""

from __future__ import annotations

import linecache
import os
import re
import sys
from collections.abc import Sequence

from distnb.ranklist import format_ranks
from distnb.records.cell import RankInfo
from distnb.session.cluster.members import Member, Role, own_lines
from distnb.userfiles import is_users

__all__ = [
    "RESTART",
    "crash_site",
    "death_reason",
    "death_report",
    "member_name",
    "stopped_detail",
    "stopped_message",
]

RESTART = "Run %dist_restart (or session.restart()) for a working cluster."
LAST_LINES = 8  # of a dead rank's output, in its report
# faulthandler's dump starts with this line; its frames read `  File "PATH", line N in NAME`.
_FATAL = "Fatal Python error:"
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)')
# IPython compiles an engine's cells to files like /tmp/ipykernel_4242/123456.py.
_CELL_FILE = re.compile(r"ipykernel_\d+[/\\]\d+\.py$")
_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# What the loss of each vital member means for the session.
_MEANS = {
    Role.CONTROLLER: "the kernel can no longer reach the ranks (they may still be running)",
    Role.HEART: "without its heartbeat the ranks stop themselves within about 30 s",
    Role.ENGINE: "the process group lost a member",
    Role.NANNY: "that rank can no longer be interrupted, and its death would go unseen",
}


def member_name(member: Member, ranks: Sequence[RankInfo]) -> str:
    """`rank 1 (pid 4242 on vm)`, `rank 1's nanny (pid 4250)`, `the ipyparallel controller
    (pid 4240)`."""
    by_pid = {r.pid: r for r in ranks}
    if member.role is Role.ENGINE and (info := by_pid.get(member.pid)) is not None:
        return f"rank {info.rank} (pid {info.pid} on {info.host})"
    if member.role is Role.NANNY and (info := by_pid.get(member.parent)) is not None:
        return f"rank {info.rank}'s nanny (pid {member.pid}, ipyparallel's signal relay)"
    if member.role in (Role.ENGINE, Role.NANNY):
        return f"an {member.role.value} (pid {member.pid})"
    return f"{member.role.value} (pid {member.pid})"


def death_reason(member: Member, how: str, ranks: Sequence[RankInfo], when: str = "") -> str:
    """The whole sentence for a session that lost a member, with what to run.

    >>> death_reason(Member(4240, Role.CONTROLLER), "was killed by SIGKILL", [], " in cell In[3]")
    'the ipyparallel controller (pid 4240) was killed by SIGKILL in cell In[3]: the kernel can
    no longer reach the ranks (they may still be running). Run %dist_restart ...'
    """
    means = _MEANS.get(member.role, "the cluster lost a process")
    return f"{member_name(member, ranks)} {how}{when}: {means}. {RESTART}"


def crash_site(lines: Sequence[str], code: str, user: Sequence[str] = ()) -> str:
    """`, at line 4: dist.broadcast(x, src=1)` from faulthandler's dump of a dying rank: the
    innermost frame of the user's: a file of `user` (the script a `%dist_run` ran and the
    folder beside it, wherever they lie: `distnb.userfiles`), else the cell (its line looked up
    in the cell's `code`), else any file outside the libraries; "" when the dump names none."""
    fallback = ""
    for line in lines:
        frame = _FRAME.match(line)
        if frame is None:
            continue
        path, number = frame["file"], int(frame["line"])
        if is_users(path, user):
            text = linecache.getline(path, number).strip()
            return f", at {path} line {number}" + (f": {text}" if text else "")
        if _CELL_FILE.search(path) and not user:
            source = code.splitlines()
            text = source[number - 1].strip() if 0 < number <= len(source) else ""
            return f", at line {number}: {text}" if text else f", at line {number}"
        if not fallback and not _is_library(path) and not _CELL_FILE.search(path):
            fallback = f", at {path} line {number}"
    return fallback


def death_report(
    info: RankInfo,
    how: str,
    when: str,
    log: str,
    code: str | None,
    shared: bool = False,
    user: Sequence[str] = (),
) -> list[str]:
    """The lines of a `RankDiedError` for one rank: who, how and when (" in cell In[4]") it
    died, at which line of `code` (the cell it ran, if known) or of the script it ran (`user`:
    its paths), and its last output (`log`: what it wrote since the cell started, gloo's or
    NCCL's abort reason included; `shared`: the log of a launcher that every rank writes to,
    such as mpiexec's).
    """
    lines = own_lines(log)
    fatal = next((i for i, line in enumerate(lines) if line.startswith(_FATAL)), len(lines))
    said, dump = lines[:fatal], lines[fatal:]
    site = crash_site(dump, code, user) if code is not None else ""
    report = [f"rank {info.rank} (pid {info.pid} on {info.host}) {how}{when}{site}"]
    if said:
        shown = said[-LAST_LINES:]
        more = f" (the last {len(shown)} of {len(said)} lines)" if len(said) > len(shown) else ""
        whose = (
            "the launcher's last output (every rank writes to it)" if shared else "its last output"
        )
        report.append(f"  {whose}{more}:")
        report.extend("    " + line for line in shown)
    return report


def stopped_detail(info: RankInfo) -> tuple[str, str]:
    """A hang report's (detail, stack) for a rank whose process is stopped."""
    return (
        f"stopped (pid {info.pid} is suspended: SIGSTOP, Ctrl-Z or a debugger; "
        f"kill -CONT {info.pid} resumes it)",
        "(no stack: a stopped process cannot answer)",
    )


def stopped_message(stopped: Sequence[RankInfo]) -> str:
    pids = " ".join(str(t.pid) for t in stopped)
    verb = "is" if len(stopped) == 1 else "are"
    return (
        f"{format_ranks(t.rank for t in stopped)} {verb} stopped, not running: kill -CONT "
        f"{pids} continues this cell there (the next cell waits for it), or run %dist_restart."
    )


def _is_library(path: str) -> bool:
    """Python's own files, installed packages and distnb's (its frames say nothing to users)."""
    if (
        path.startswith(_PACKAGE)
        or "/site-packages/" in path
        or "/dist-packages/" in path
        or path.startswith("<")
    ):
        return True
    return path.startswith((sys.prefix, sys.base_prefix, sys.exec_prefix))
