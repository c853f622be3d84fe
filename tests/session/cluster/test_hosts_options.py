"""Ranks on other hosts: options that cannot work are refused before anything starts, with
what to write instead (tests/multihost starts ranks on a rehearsal host)."""

from __future__ import annotations

import warnings

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import distnb
from distnb.errors import ConfigError, DistnbWarning
from distnb.magics import DistMagics
from distnb.session.cluster.engines import Launcher, Local, Mpi
from distnb.session.cluster.slurm import Slurm
from distnb.session.cluster.ssh import Ssh
from distnb.session.options import Options, engine_kind

KIND = {"n": None, "backend": "gloo", "host": "10.0.0.1", "hosts": None, "python": "",
        "ssh_args": (), "slurm": ()}  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"engines": "ssh"}, "--hosts node1:4,node2:4"),
        ({"hosts": "h2:2"}, "cannot reach the control plane on 127.0.0.1"),
        ({"hosts": "h2:2", "n": 3, "host": "10.0.0.1"}, "-n 3 but --hosts names 2 ranks"),
        ({"hosts": "h2:x", "host": "10.0.0.1"}, "name:ranks pairs"),
        ({"engines": "slurm"}, "Slurm's nodes cannot reach the control plane on 127.0.0.1"),
        ({"slurm": "-p gpu"}, "--slurm passes options to sbatch or srun: add --engines slurm"),
    ],
    ids=["no-hosts", "loopback", "n-disagrees", "bad-count", "slurm-loopback", "slurm-alone"],
)
def test_hosts_that_cannot_work_are_refused_before_anything_starts(
    kwargs: dict[str, object], said: str
) -> None:
    with pytest.raises(ConfigError, match=said):
        distnb.start(progress=False, **kwargs)  # type: ignore[arg-type]


def test_the_magic_takes_the_hosts(shell: InteractiveShell) -> None:
    magics = DistMagics(shell)  # with no session of its own yet
    with pytest.raises(UsageError, match=r"cannot reach the control plane on 127\.0\.0\.1"):
        magics.dist_start("--hosts node1:2,node2:2 --python /opt/py/bin/python")
    with pytest.raises(UsageError, match="add --engines slurm"):
        magics.dist_start('-n 4 --slurm "--partition gpu --time 1:00:00"')


def test_each_launcher_is_an_engine_kind_built_once() -> None:
    assert isinstance(engine_kind("local", **KIND), Local)
    assert isinstance(engine_kind("mpi", **KIND), Mpi)
    assert isinstance(engine_kind("pbs", **KIND), Launcher)
    ssh = engine_kind("local", **{**KIND, "hosts": "h2:2,h3:1", "ssh_args": ["-i", "key"]})
    assert isinstance(ssh, Ssh) and ssh.ranks(None, "gloo") == 3
    settings = ssh.launcher_settings()
    assert settings["engines"] == {"h2": 2, "h3": 1}
    assert settings["ssh_args"][:2] == ["-i", "key"]  # the user's first: ssh keeps the first
    assert ssh.heart_misses < Local(2, "gloo").heart_misses
    with pytest.raises(ConfigError, match="n must be a whole number"):
        Options(n=0, engines=Local(2, "gloo"))
    with pytest.raises(ConfigError, match="backend must be one of"):
        engine_kind("local", **{**KIND, "backend": "mpi"})


def test_slurm_options_reach_the_launcher_as_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    """sbatch's from a login node; srun's inside an allocation, which gives `n` its tasks."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    kind = engine_kind("slurm", **{**KIND, "slurm": "-p gpu -t '1:00:00'"})
    assert isinstance(kind, Slurm) and kind.ranks(4, "gloo") == 4
    assert kind.launcher_settings()["submit_command"] == [
        "sbatch", "-p", "gpu", "-t", "1:00:00",
    ]  # fmt: skip
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    inside = Slurm(("--overlap",), "10.0.0.1")
    assert inside.ranks(None, "gloo") == 8
    assert inside.launcher_settings()["mpi_cmd"] == ["srun"]
    assert inside.launcher_settings()["mpi_args"] == ["--overlap"]


def test_local_ranks_from_an_allocations_login_shell_are_questioned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`salloc` then Jupyter on the login node: local ranks would run there, not on the nodes."""
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[1-2]")
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    with pytest.warns(
        DistnbWarning, match=r"allocation 12 but not on its nodes \(gpu\[1-2\]\)"
    ) as said:
        engine_kind("local", **KIND)  # the warning is raised deep inside distnb
    assert [w.filename for w in said] == [__file__]  # but points at the caller's line
    monkeypatch.setenv("SLURMD_NODENAME", "gpu1")  # a kernel on a node of it: its own GPUs
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Local(2, "gloo")
