"""The torch-free store client against torch's own server, both of its backends (libuv, the
default, and the classic one): every operation, read back through torch's client; timeouts; a
server that goes away; something that is not a store; signed values shared with the ranks'
`SignedStore`."""

from __future__ import annotations

import datetime
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import torch.distributed as dist

from distnb.contract import keys
from distnb.contract.signed import SignedStore
from distnb.contract.signing import ForgedValueError, Signed
from distnb.contract.storewire import StoreGone, StoreTimeout, WireStore
from harness.processes import NAMED_S

RUN = "run-7"
SECRET = b"w" * 32


@pytest.fixture(params=[True, False], ids=["libuv", "classic"])
def libuv(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def serve(libuv: bool) -> dist.TCPStore:
    """What the launcher hosts: the job's store, with its server."""
    return dist.TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        use_libuv=libuv,
        timeout=datetime.timedelta(seconds=NAMED_S),
    )


@pytest.fixture
def server(libuv: bool) -> Iterator[dist.TCPStore]:
    yield serve(libuv)


def torch_client(server: dist.TCPStore) -> dist.Store:
    """What a rank holds: torch's client under the run's prefix."""
    raw = dist.TCPStore(
        "127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=NAMED_S)
    )
    return dist.PrefixStore(RUN, raw)


def wire(server: dist.TCPStore, timeout_s: float = NAMED_S) -> WireStore:
    return WireStore("127.0.0.1", server.port, RUN, timeout_s)


def test_every_operation_means_what_torchs_does(server: dist.TCPStore) -> None:
    ours, theirs = wire(server), torch_client(server)
    ours.set("a", "text")
    ours.set("b", b"\x00\xffbytes")
    assert theirs.get("a") == b"text" and theirs.get("b") == b"\x00\xffbytes"
    assert server.get(f"{RUN}/a") == b"text"  # the prefix is PrefixStore's
    theirs.set("c", b"from a rank")
    assert ours.get("c") == b"from a rank"
    assert ours.multi_get(["a", "c"]) == [b"text", b"from a rank"]
    assert ours.check(["a", "c"]) and not ours.check(["a", "nothing"])
    assert ours.add("n", 3) == 3 and theirs.add("n", 2) == 5 and ours.add("n", -1) == 4
    assert ours.get("n") == b"4"
    assert ours.compare_set("cs", "", "first") == b"first"  # absent, expected empty: set
    assert ours.compare_set("cs", "wrong", "second") == b"first"
    assert ours.compare_set("cs", "first", "second") == b"second"
    assert theirs.get("cs") == b"second"
    assert ours.compare_set("absent", "x", "y") == b"x"  # torch's server says `expected`
    assert not ours.check(["absent"])
    assert ours.delete_key("a") and not ours.delete_key("a") and not theirs.check(["a"])
    assert ours.num_keys() == theirs.num_keys()
    ours.close()


def test_many_queries_in_one_write_are_answered_in_order(server: dist.TCPStore) -> None:
    ours, theirs = wire(server), torch_client(server)
    names = [f"calls/{r}" for r in range(500)]  # an attached job's ranks, asked at once
    theirs.add("calls/7", 4)
    numbers = ours.add_each(names, 1)
    assert numbers == [5 if n == "calls/7" else 1 for n in names]
    ours.set_each([(f"req/{r}", f"body {r}") for r in range(500)])
    assert [theirs.get(f"req/{r}") for r in (0, 250, 499)] == [b"body 0", b"body 250", b"body 499"]
    theirs.set("reply/3", b"done")
    asked = [f"reply/{r}" for r in range(6)]
    assert ours.present_each(asked) == [r == 3 for r in range(6)]
    ours.delete_each([f"req/{r}" for r in range(500)] + ["never/set"])
    assert not theirs.check(["req/0"]) and not theirs.check(["req/499"])
    assert ours.add("calls/7", 0) == 5  # the connection is in step after every batch
    signed = Signed(wire(server), SECRET)
    signed.set_each([("s/0", "zero"), ("s/1", "one")])
    assert SignedStore(theirs, SECRET).get("s/1") == b"one"
    assert signed.present_each(["s/0", "s/2"]) == [True, False] and signed.add_each(["x"], 2) == [2]
    ours.close()
    signed.close()


def test_a_wait_ends_when_the_keys_come_or_at_its_timeout(server: dist.TCPStore) -> None:
    ours, theirs = wire(server), torch_client(server)
    threading.Timer(0.2, lambda: theirs.set("later", "x")).start()
    t = time.monotonic()
    ours.wait(["later"], datetime.timedelta(seconds=NAMED_S))
    assert 0.1 < time.monotonic() - t < NAMED_S
    with pytest.raises(StoreTimeout, match=rf"wait timeout after 300ms, keys: .*/{RUN}/never"):
        ours.wait(["later", "never"], datetime.timedelta(seconds=0.3))
    ours.set("after", "y")  # the cancelled wait left the connection usable
    assert ours.get("after") == b"y"


def test_get_waits_for_its_key_up_to_the_stores_timeout(server: dist.TCPStore) -> None:
    ours = wire(server, timeout_s=0.3)
    with pytest.raises(StoreTimeout, match="wait timeout after 300ms"):
        ours.get("never")
    with pytest.raises(StoreTimeout):
        ours.multi_get(["never"])
    torch_client(server).set("soon", "z")
    assert ours.get("soon") == b"z"


def test_a_server_that_goes_away_is_said_at_the_next_query(libuv: bool) -> None:
    server = serve(libuv)
    ours = wire(server)
    ours.set("k", "v")
    port = server.port
    del server  # the launcher ends: its store's server with it
    time.sleep(0.2)
    with pytest.raises(StoreGone, match=rf"the store at 127.0.0.1:{port} went away"):
        ours.set("k", "v")
        ours.get("k")
    with pytest.raises(StoreGone, match="is closed"):
        ours.check(["k"])


def test_no_server_and_not_a_store_are_said_at_once() -> None:
    with socket.socket() as idle:
        idle.bind(("127.0.0.1", 0))
        port = idle.getsockname()[1]  # bound, not listening: refused
        t = time.monotonic()
        with pytest.raises(StoreGone, match=rf"cannot connect to the store at 127.0.0.1:{port}"):
            WireStore("127.0.0.1", port, RUN, timeout_s=0.5)
        assert time.monotonic() - t < NAMED_S  # retried while refused, up to the timeout
    with socket.socket() as other:  # something else listens there: it answers nothing
        other.bind(("127.0.0.1", 0))
        other.listen()
        with pytest.raises(StoreGone, match=r"no answer in 0\.3 s"):
            WireStore("127.0.0.1", other.getsockname()[1], RUN, timeout_s=0.3)


def test_signed_values_pass_between_the_kernel_and_the_ranks(server: dist.TCPStore) -> None:
    kernel = Signed(wire(server), SECRET)
    rank = SignedStore(torch_client(server), SECRET)
    rank.set(keys.agent_rank(0), '{"rank": 0}')
    assert kernel.get(keys.agent_rank(0)) == b'{"rank": 0}'
    kernel.set(keys.AGENT_LEASE, "1")
    assert rank.get(keys.AGENT_LEASE) == b"1"
    server.set(f"{RUN}/{keys.host(1)}", b"a stranger's bytes")
    with pytest.raises(ForgedValueError, match=r"rank 1's host identity"):
        kernel.get(keys.host(1))
    assert kernel.multi_get([keys.host(1)]) == [b""] and not kernel.check([keys.host(1)])
    assert kernel.take_forged() == [keys.host(1)]


def test_a_query_cut_by_ctrl_c_costs_its_connection_not_the_next_answers(
    server: dist.TCPStore,
) -> None:
    """Ctrl-C while a query waits for its answer leaves that answer due on the connection: a
    client that went on there would read it as the next query's. The next query gets a new
    connection and its own answer."""
    import os
    import signal

    store = wire(server)
    rank = torch_client(server)
    fired = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    fired.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            store.wait(["never"], datetime.timedelta(seconds=NAMED_S))  # cut while it waits
    finally:
        fired.cancel()
        fired.join()
    rank.set("never", b"now")  # the cut wait's answer would come now, on the old connection
    rank.set("other", b"mine")
    assert store.get("other") == b"mine"
    assert store.add("count", 5) == 5 and store.check(["never"])
    store.close()
