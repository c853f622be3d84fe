"""The control plane off loopback is signed: a stranger who reaches its port and writes forged
keys crashes, confuses and runs nothing (distnb.contract.signed)."""

from __future__ import annotations

import datetime
import marshal
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist

import distnb
from distnb.contract import keys
from distnb.errors import CollectiveMismatchError
from distnb.session import Session
from harness.hosts import Lan, missing

pytestmark = [
    pytest.mark.multihost,
    pytest.mark.skipif(bool(missing()), reason=f"rehearsal hosts need {missing()}"),
]


@pytest.fixture(scope="module")
def exposed(lan: Lan) -> Iterator[Session]:
    """Ranks on this host, the control plane on the rehearsal network's address."""
    with distnb.start(2, host=lan.kernel_addr, progress=False) as s:
        yield s


def stranger(lan: Lan, s: Session) -> dist.TCPStore:
    assert s.control is not None
    return dist.TCPStore(
        lan.kernel_addr, s.control.port, is_master=False, timeout=datetime.timedelta(seconds=5)
    )


def test_values_on_the_wire_are_signed(lan: Lan, exposed: Session) -> None:
    assert exposed.control is not None and exposed.control.secret
    assert exposed.run("x = torch.ones(1)\ndist.all_reduce(x)\nx.item()").result(1) == "2.0"
    store = stranger(lan, exposed)
    run_key = f"{exposed.control.session_id}/{keys.RUN}"
    raw = store.get(run_key)
    assert len(raw) > 16 and len(raw[16:].decode().split()) == 5  # a tag, then the plain value


def test_forged_keys_crash_confuse_and_run_nothing(
    lan: Lan, exposed: Session, tmp_path: Path
) -> None:
    assert exposed.control is not None
    store = stranger(lan, exposed)
    prefix = exposed.control.session_id
    pwned = tmp_path / "pwned"
    code = marshal.dumps(compile(f"open({str(pwned)!r}, 'w')", "x", "exec"))
    forged = [b"", b"F\xff\xff\xff\xff" + code, b"{" * 1000, b'{"state": "deadlock"}', code]
    existing = [k for k in store.list_keys() if k.startswith(prefix)]
    assert existing  # the session's keys, all readable to anyone on the network
    # every key the session wrote, and the ones its next cells will read, written over
    names = existing + [f"{prefix}/{keys.abort(run)}" for run in range(1, 50)]
    names += [f"{prefix}/{keys.RUN}", f"{prefix}/{keys.ask(1)}", f"{prefix}/{keys.answer(1)}"]
    for i, name in enumerate(names):
        if "pg/" not in name:  # the process group's rendezvous: read once, at the start
            store.set(name, forged[i % len(forged)])
    for rank in (0, 1):  # requests for input that no rank made
        store.set(f"{prefix}/{keys.ask_count(rank)}", b"5")
    result = exposed.run("x = torch.full((4,), rank + 1.0)\ndist.all_reduce(x)\nx.tolist()")
    assert result.result(0) == result.result(1) == "[3.0, 3.0, 3.0, 3.0]"
    with pytest.raises(CollectiveMismatchError, match=r"rank 1: broadcast\(float32\[3\]"):
        exposed.run("dist.broadcast(torch.zeros(2 + rank), src=0)")
    assert exposed.run("y = torch.ones(1)\ndist.all_reduce(y)\ny.item()").result(0) == "2.0"
    assert not pwned.exists()
