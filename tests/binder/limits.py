"""Binder's limits on this machine: a cgroup with 1 CPU and 2 GiB of memory, and no swap.

A process joins it by writing its pid to each of `procs` (what `join_script` does before it
execs the command); its children are born in it. cgroup v2 (one hierarchy, `/sys/fs/cgroup`) and
v1 (a `memory` and a `cpu` hierarchy, as on hosts with the hybrid layout) are both handled.
`close()` kills whatever still runs in it and removes it; `sweep()` removes the empty ones a
killed test run left (its name ends with its pid).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
MEMORY = 2 * 2**30
CPU_PERIOD_US = 100_000  # one CPU: a quota of one period per period


class Unavailable(Exception):
    """No cgroup can be made here; the message says why."""


def sweep(prefix: str) -> None:
    """Remove `{prefix}{pid}` cgroups whose process is gone and that hold no process."""
    try:
        parents = [_v2_parent()] if (ROOT / "cgroup.controllers").exists() else []
        parents += [ROOT / c / _own(c) for c in ("memory", "cpu") if not parents]
    except OSError:
        return
    for parent in parents:
        for path in parent.glob(f"{prefix}*"):
            pid = path.name[len(prefix) :]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                with contextlib.suppress(OSError):  # busy: something still runs there
                    path.rmdir()


class Limits:
    """A fresh cgroup (v2) or pair of cgroups (v1: memory, cpu) under this process's own."""

    def __init__(self, name: str) -> None:
        self.dirs: list[Path] = []
        try:
            if (ROOT / "cgroup.controllers").exists():
                self.v2 = True
                self._make_v2(name)
            else:
                self.v2 = False
                self._make_v1(name)
        except OSError as exc:
            self.close()
            raise Unavailable(f"cannot make a cgroup with 1 CPU and 2 GiB here: {exc}") from exc

    @property
    def procs(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs]

    def pids(self) -> list[int]:
        found: set[int] = set()
        for path in self.procs:
            with contextlib.suppress(OSError):
                found.update(int(p) for p in path.read_text().split())
        return sorted(found)

    def oom_kills(self) -> int:
        """How many processes the OOM killer killed in the cgroup so far."""
        memory = self.dirs[0]
        name = "memory.events" if self.v2 else "memory.oom_control"
        for line in (memory / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def peak(self) -> int | None:
        """The most memory the cgroup used since `reset_peak()` (None where not recorded)."""
        path = self.dirs[0] / ("memory.peak" if self.v2 else "memory.max_usage_in_bytes")
        try:
            return int(path.read_text())
        except (OSError, ValueError):
            return None

    def reset_peak(self) -> None:
        path = self.dirs[0] / ("memory.peak" if self.v2 else "memory.max_usage_in_bytes")
        with contextlib.suppress(OSError):  # v2 before Linux 6.12 cannot reset it
            path.write_text("0" if not self.v2 else "reset")

    def join_script(self, path: Path, then: list[str]) -> Path:
        """A shell script that moves itself into the cgroup, then execs `then` + its args."""
        lines = ["#!/bin/sh", "set -e"]
        lines += [f"echo $$ > '{procs}'" for procs in self.procs]
        lines.append("exec " + " ".join(f"'{part}'" for part in then) + ' "$@"')
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o755)
        return path

    def close(self, wait_s: float = 10.0) -> None:
        """Kill every process left in the cgroup, then remove it."""
        deadline = time.monotonic() + wait_s
        while self.dirs:
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            for d in list(self.dirs):
                with contextlib.suppress(FileNotFoundError):
                    try:
                        d.rmdir()
                    except OSError:  # still busy: its processes are dying
                        continue
                self.dirs.remove(d)
            if self.dirs and time.monotonic() > deadline:
                raise RuntimeError(f"could not remove {self.dirs}: pids {self.pids()} remain")
            if self.dirs:
                time.sleep(0.05)

    # --- making them ---------------------------------------------------------------------------

    def _make_v2(self, name: str) -> None:
        path = _v2_parent() / name
        path.mkdir()
        self.dirs.append(path)
        (path / "memory.max").write_text(str(MEMORY))
        with contextlib.suppress(FileNotFoundError):  # without swap accounting there is none
            (path / "memory.swap.max").write_text("0")
        (path / "cpu.max").write_text(f"{CPU_PERIOD_US} {CPU_PERIOD_US}")

    def _make_v1(self, name: str) -> None:
        for controller in ("memory", "cpu"):
            if not (ROOT / controller / "cgroup.procs").exists():
                raise OSError(f"no cgroup v2 and no v1 {controller} controller under {ROOT}")
        memory = ROOT / "memory" / _own("memory") / name
        memory.mkdir()
        self.dirs.append(memory)
        (memory / "memory.limit_in_bytes").write_text(str(MEMORY))
        with contextlib.suppress(OSError):  # without swap accounting there is no swap to cap
            (memory / "memory.memsw.limit_in_bytes").write_text(str(MEMORY))
        cpu = ROOT / "cpu" / _own("cpu") / name
        cpu.mkdir()
        self.dirs.append(cpu)
        (cpu / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
        (cpu / "cpu.cfs_quota_us").write_text(str(CPU_PERIOD_US))


def _v2_parent() -> Path:
    """Where a child with memory and cpu limits can go: this process's cgroup, or its parent.

    A cgroup whose children get controllers may hold no processes itself (v2's "no internal
    processes" rule, the root excepted), so this process's own cgroup serves only where its
    children have them already or it is the root; its parent, where this one has them.
    """
    own = ROOT / _own("")
    for parent in (own, own.parent):
        enabled = set((parent / "cgroup.subtree_control").read_text().split())
        if {"memory", "cpu"} <= enabled:
            return parent
        if parent == ROOT:
            (parent / "cgroup.subtree_control").write_text("+memory +cpu")
            return parent
    raise OSError(f"neither {own} nor its parent gives its children memory and cpu limits")


def _own(controller: str) -> str:
    """This process's cgroup (relative) in the hierarchy of `controller` ("" for v2)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if (controller and controller in names.split(",")) or (not controller and not names):
            return path.lstrip("/")
    raise OSError(f"this process is in no {controller or 'v2'} cgroup")
