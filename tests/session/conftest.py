"""Fixtures of the session tests."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from distnb.session.cluster.oom import memory_cgroup


@pytest.fixture
def small_cgroup() -> Iterator[Path]:
    """A cgroup v1 memory cgroup under this process's, limited to 150 MiB (skips elsewhere)."""
    parent = memory_cgroup(os.getpid())
    limit_file = Path(parent or "/nonexistent") / "memory.limit_in_bytes"
    if parent is None or not limit_file.exists() or not os.access(parent, os.W_OK):
        pytest.skip("needs a writable cgroup v1 memory controller (root in a VM or container)")
    path = Path(parent) / f"distnb-test-{os.getpid()}"
    path.mkdir()
    try:
        (path / "memory.limit_in_bytes").write_text(str(150 * 2**20))
        yield path
    finally:
        for pid in (path / "cgroup.procs").read_text().split():
            os.kill(int(pid), signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                path.rmdir()
                break
            except OSError:
                time.sleep(0.05)
