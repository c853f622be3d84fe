"""Ranks on other hosts: options that cannot work are refused before anything starts, with
what to write instead (tests/multihost starts ranks on a rehearsal host)."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import distnb
from distnb.errors import ConfigError
from distnb.magics import DistMagics


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"engines": "ssh"}, "--hosts node1:4,node2:4"),
        ({"hosts": "h2:2"}, "cannot reach the control plane on 127.0.0.1"),
        ({"hosts": "h2:2", "n": 3, "host": "10.0.0.1"}, "-n 3 but --hosts names 2 ranks"),
        ({"hosts": "h2:x", "host": "10.0.0.1"}, "name:ranks pairs"),
    ],
    ids=["no-hosts", "loopback", "n-disagrees", "bad-count"],
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
