"""A torchrun job across two rehearsal hosts, attached from the kernel's side of the network.

`python -m distnb.run --nnodes 2`, one rank on each host, started over ssh as a user starts one
(static rendezvous on the first host's address); the hosts' homes are their own, so the run
folder is copied as a user copies it (`scp -rp`, the secret's 0600 kept): from the first host
to the notebook's machine and to the second host, whose launcher joins the first one's control
plane (`distnb.runplace`). Rank 1 skips a collective; the notebook, attached by `host:port` and
by the run folder, names rank 1 and both lines, with every rank's host and stack.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import distnb
from distnb.errors import ConfigError
from distnb.records.attach import AgentState
from distnb.session.attach import AttachedJob, attach_processes, procs
from harness import host_jobs as jobs
from harness.hosts import Lan, missing
from harness.jobs import (
    CHECKPOINT,
    LEFT_THE_LOOP,
    METRICS,
    SKIPPED,
    START_S,
    TRAIN,
    judged,
)

pytestmark = [
    pytest.mark.multihost,
    pytest.mark.gloo,
    pytest.mark.skipif(bool(missing()), reason=f"rehearsal hosts need {missing()}"),
]


@pytest.fixture
def hung(lan: Lan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The job, hung; yields the run folder copied to this machine (`DISTNB_RUNS` here)."""
    name, mark = f"across-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    here = tmp_path / "runs"
    clients = jobs.across(lan, name, mark, logs, here)
    try:
        monkeypatch.setenv("DISTNB_RUNS", str(here))
        jobs.wait_for(logs, r"final 1 ")  # rank 1 has left the loop
        yield here / name
    finally:
        jobs.end(lan, mark, clients)
        assert jobs.left(lan, mark) == []


def settle(job: AttachedJob) -> list:
    """Rank 0 in its last all_reduce, rank 1 in the "checkpoint" it never finishes."""
    deadline = time.monotonic() + START_S
    while True:
        snaps = job.snapshots()
        call = snaps[0].current
        if (
            call is not None
            and call.seq == 15
            and snaps[1].stack[-1:]
            and (snaps[1].stack[-1].line == CHECKPOINT)
        ):
            return snaps
        assert time.monotonic() < deadline, [(s.rank, s.state, s.where) for s in snaps]
        time.sleep(0.2)


def test_a_job_across_two_hosts_is_attached_by_address_and_by_folder(lan: Lan, hung: Path) -> None:
    a, b = lan.hosts[0], lan.hosts[1]
    endpoint = json.loads((hung / "endpoint.json").read_text())
    assert (endpoint["host"], endpoint["hostname"]) == (a.addr, a.name)
    assert (hung / "secret").stat().st_mode & 0o777 == 0o600
    job = distnb.attach(f"{a.addr}:{endpoint['port']}", timeout=START_S)
    try:
        snaps = settle(job)
        assert [(s.host, s.state) for s in snaps] == [
            (a.name, AgentState.COLLECTIVE), (b.name, AgentState.RUNNING),
        ]  # fmt: skip
        train = str(TRAIN)  # every rank's live stack, from its agent
        assert (train, METRICS) in [(f.file, f.line) for f in snaps[0].stack]
        judged(job, lambda v: LEFT_THE_LOOP in v and SKIPPED in v)
    finally:
        job.detach()
    with distnb.attach(str(hung), timeout=START_S) as again:
        text = repr(again.status())
        assert "in all_reduce #15 on WORLD" in text and a.name in text and b.name in text


def test_a_job_without_the_agent_is_read_on_its_hosts_over_ssh(lan: Lan, tmp_path: Path) -> None:
    """Plain torchrun on both hosts: `attach_processes(hosts=...)` finds the ranks on each host
    by their environment and reads their stacks with py-spy there, over ssh."""
    if procs.pyspy() is None:
        pytest.skip("py-spy is not installed")
    a, b = lan.hosts[0], lan.hosts[1]
    mark, logs = uuid.uuid4().hex, [tmp_path / "a.log", tmp_path / "b.log"]
    clients = []
    try:
        for node, (host, log) in enumerate(zip((a, b), logs, strict=True)):
            line = jobs.command(lan, str(node), a.addr, mark, agent=False)
            clients.append(jobs.on(lan, host, line, log))
        jobs.wait_for(logs, r"final 1 ")
        where = [f"root@{a.addr}", f"root@{b.addr}"]
        train = str(TRAIN)
        deadline = time.monotonic() + START_S
        while True:  # until rank 0 has reached its last all_reduce
            view = attach_processes(hosts=where, ssh_args=lan.ssh_args)
            if f"rank 0 sits in all_reduce at {train}:{METRICS}" in view.verdicts:
                break
            assert time.monotonic() < deadline, view.verdicts
            time.sleep(0.5)
        assert [(s.rank, s.host, s.source) for s in view.snapshots] == [
            (0, a.name, "py-spy"), (1, b.name, "py-spy"),
        ]  # fmt: skip
        assert f"rank 1 runs outside any collective, at {train}:{CHECKPOINT} in main" in (
            view.verdicts
        )
        shown = magic(lan, tmp_path, f"--no-agent --hosts {','.join(where)}")
        assert [s.host for s in shown.snapshots] == [a.name, b.name]  # type: ignore[attr-defined]
        assert f"verdict: rank 0 sits in all_reduce at {train}:{METRICS}" in repr(shown)
        with pytest.raises(ConfigError, match=r"could not read the ranks on root@198\.18\..* "
                           r"over ssh .*python=\.\.\. names its Python"):  # fmt: skip
            attach_processes(hosts=where[:1], ssh_args=lan.ssh_args, python="/opt/none/python")
    finally:
        jobs.end(lan, mark, clients)
        assert jobs.left(lan, mark) == []


def magic(lan: Lan, tmp: Path, line: str) -> object:
    """`%dist_attach LINE` in a real IPython shell, its ssh reaching the rehearsal hosts as a
    user's ssh config would (the Lan's key and options, from an `ssh` first on PATH)."""
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython

    bin_ = tmp / "bin"
    bin_.mkdir()
    real = shutil.which("ssh")
    (bin_ / "ssh").write_text(f'#!/bin/sh\nexec {real} {shlex.join(lan.ssh_args)} "$@"\n')
    (bin_ / "ssh").chmod(0o755)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
        ip = start_ipython() or get_ipython()
        ip.run_line_magic("load_ext", "distnb")
        return ip.run_line_magic("dist_attach", line)
