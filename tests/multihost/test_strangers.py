"""A stranger on the network at every phase of a session across hosts (issue 35).

It reaches the control plane's port and writes random bytes over every key of the session
(`stranger.Stranger`). The store is signed, so nothing it writes is believed; what this checks
is that nothing wedges either: a wait on a forged value says so and gets a valid copy again
(the writer posts it again: `distnb.contract.posts`, `ControlPlane.keep`), or fails at once naming
the key's role, and the next cell works without a restart.
"""

from __future__ import annotations

import builtins
import threading
import time
from typing import Any

import pytest

from distnb.errors import CollectiveDesyncError, SessionError
from distnb.session import Session
from distnb.session.cluster.ssh import Ssh
from distnb.session.options import Options
from harness.hosts import Lan, missing
from harness.stranger import Stranger
from tests.multihost.conftest import engines_on, start_on

pytestmark = [
    pytest.mark.multihost,
    pytest.mark.skipif(bool(missing()), reason=f"rehearsal hosts need {missing()}"),
]

ATTACK_S = 2.0  # continuous overwrites, every few milliseconds
BOUND_S = 60.0  # named rather than hanging: an attack of ATTACK_S delays a cell by seconds
FORGED = "was overwritten by something that does not hold the session's secret"
REDUCE = "x = torch.full((2,), rank + 1.0)\ndist.all_reduce(x)\nx.tolist()"
LOOP = (
    "import time\nfor _ in range(20):\n    x = torch.ones(1)\n    dist.all_reduce(x)\n"
    "    time.sleep(0.1)\nx.item()"
)


def stranger(lan: Lan, s: Session) -> Stranger:
    assert s.control is not None
    return Stranger(lan.kernel_addr, s.control.port, s.control.session_id)


def reduces(s: Session) -> None:
    """The next checked collective across the hosts is right (named, not a wait for gloo's
    10 minutes, if it is not)."""
    result = s.run(REDUCE, timeout=BOUND_S)
    assert result.result(0) == result.result(1) == "[3.0, 3.0]"


def said(result: Any) -> str:
    return "".join(o.stderr for o in result.outputs)


def test_a_start_under_attack_fails_at_once_naming_the_key_or_goes_on(lan: Lan) -> None:
    hosts = {h.addr: 1 for h in lan.hosts}
    kind = Ssh(hosts, lan.kernel_addr, ssh_args=lan.ssh_args)
    session = Session(Options(n=2, engines=kind, host=lan.kernel_addr, progress=False))
    outcome: list[BaseException | None] = []

    def start() -> None:
        try:
            session.start()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    starting = threading.Thread(target=start)
    starting.start()
    while session.control is None and starting.is_alive():
        time.sleep(0.005)
    attack = stranger(lan, session).keep_writing() if session.control is not None else None
    starting.join(BOUND_S)
    if attack is not None:
        attack.stop()
    assert not starting.is_alive() and outcome, "the start wedged"
    try:
        if outcome[0] is not None:  # the rendezvous read a forged value: said, nothing left
            assert isinstance(outcome[0], SessionError) and FORGED in str(outcome[0])
            assert "did not start" in str(outcome[0])
            assert all(engines_on(h) == 0 for h in lan.hosts)
            session.start()
        reduces(session)
    finally:
        session.stop()


def test_a_stranger_at_every_phase_of_a_session(lan: Lan, monkeypatch: pytest.MonkeyPatch) -> None:
    s = start_on(lan, {h.addr: 1 for h in lan.hosts})
    try:
        # install: every key overwritten once before the first checked collective (the issue's
        # case: the host identities, written once, read at the first collective)
        assert stranger(lan, s).overwrite_all() > 0
        started = time.monotonic()
        result = s.run(REDUCE)
        assert result.result(0) == result.result(1) == "[3.0, 3.0]"
        assert "host identity" in said(result) and FORGED in said(result)
        assert time.monotonic() - started < BOUND_S

        # collectives, and the kernel's note of each cell, while it writes again and again
        attack = stranger(lan, s).keep_writing(ATTACK_S)
        result = s.run(LOOP, timeout=BOUND_S)
        attack.stop()
        assert result.result(0) == result.result(1) == "2.0"

        # a rank waiting for one that finished: the referee's beacons and abort key
        attack = stranger(lan, s).keep_writing(ATTACK_S)
        started = time.monotonic()
        with pytest.raises(CollectiveDesyncError, match="rank 1 finished"):
            s.run("x = torch.ones(1)\nif rank == 0:\n    dist.all_reduce(x)", timeout=BOUND_S)
        attack.stop()
        assert time.monotonic() - started < BOUND_S

        # the debugger's path: a rank asks the user for a line (the kernel's input())
        from IPython.testing.globalipapp import start_ipython

        start_ipython()  # a shell: the kernel can ask its user
        monkeypatch.setattr(builtins, "input", lambda prompt="": "forty-two")
        attack = stranger(lan, s).keep_writing(ATTACK_S)
        result = s.run("name = input('name? ') if rank == 1 else ''\nname", timeout=BOUND_S)
        attack.stop()
        assert result.result(1) == "'forty-two'"

        # replicas: digests through the control plane's boards
        s.run("w = torch.arange(4.0)")
        attack = stranger(lan, s).keep_writing(ATTACK_S)
        assert s.diff("w").agree
        attack.stop()
        reduces(s)  # and the session goes on, without a restart
    finally:
        # shutdown, under attack too
        attack = stranger(lan, s).keep_writing(ATTACK_S)
        report = s.stop()
        attack.stop()
    assert report.stopped == (0, 1) and report.not_reached == ()
    assert all(engines_on(h) == 0 for h in lan.hosts)
