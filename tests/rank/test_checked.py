"""The checked-collective runtime on two real gloo ranks (no mocks of torch.distributed).

The ranks start once per module (`gloo_harness.Ranks`) and run the `s_*` scenarios below by
name; this test process hosts the control plane and plays the kernel (abort key, SIGINT).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from distnb.contract import keys
from distnb.rank import checked
from distnb.rank.checked import installation
from distnb.records.beacon import Beacon, BeaconState
from harness.gloo import Outcome, Ranks
from harness.processes import NAMED_S

pytestmark = pytest.mark.gloo


@pytest.fixture(scope="module")
def ranks() -> Iterator[Ranks]:
    with Ranks(__file__, world=2) as r:
        yield r


def values(outcomes: list[Outcome]) -> list[Any]:
    return [o.unwrap() for o in outcomes]


# --- valid programs: no error, right values ---------------------------------------------------


# torch 2.13 names these two; before, the same ops go by their older names
ALL_GATHER_SINGLE = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
REDUCE_SCATTER_SINGLE = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
# gloo's list-form all_to_all came with torch 2.12
GLOO_ALL_TO_ALL = torch.__version__ >= "2.12"


def s_all_reduce(rank: int) -> list[float]:
    x = torch.full((8,), float(rank + 1))
    dist.all_reduce(x)
    return x.tolist()


def s_collectives(rank: int) -> dict[str, Any]:
    """One of each tensor collective, each used legally."""
    warnings.simplefilter("ignore", FutureWarning)  # all_gather_into_tensor is deprecated
    out: dict[str, Any] = {}
    x = torch.tensor([float(rank)])
    # broadcast from different lines on different ranks is legal
    if rank == 0:
        b = torch.tensor([7.0])
        dist.broadcast(b, src=0)
    else:
        b = torch.zeros(1)
        dist.broadcast(b, src=0)
    out["broadcast"] = b.tolist()
    r = torch.tensor([float(rank + 1)])
    dist.reduce(r, dst=1, op=dist.ReduceOp.MAX)
    out["reduce"] = r.tolist() if rank == 1 else None
    gl = [torch.zeros(1), torch.zeros(1)]
    dist.all_gather(gl, x)
    out["all_gather"] = [t.item() for t in gl]
    single = torch.zeros(2)
    ALL_GATHER_SINGLE(single, x)
    stacked = torch.zeros(2, 2)  # gloo takes the concatenated form only
    dist.all_gather_into_tensor(stacked, torch.full((1, 2), float(rank)))
    out["all_gather_single"] = single.tolist() + stacked.flatten().tolist()
    # gather: list on dst only; scatter: list on src only
    glist = [torch.zeros(1), torch.zeros(1)] if rank == 1 else None
    dist.gather(x, glist, dst=1)
    out["gather"] = [t.item() for t in glist] if glist else None
    s = torch.zeros(1)
    dist.scatter(s, [torch.tensor([10.0]), torch.tensor([11.0])] if rank == 0 else None, src=0)
    out["scatter"] = s.item()
    rs = torch.zeros(1)
    dist.reduce_scatter(rs, [torch.tensor([1.0]), torch.tensor([2.0])])
    rst = torch.zeros(1)
    dist.reduce_scatter_tensor(rst, torch.tensor([1.0, 2.0]))
    rss = torch.zeros(1)
    REDUCE_SCATTER_SINGLE(rss, torch.tensor([3.0, 4.0]))
    out["reduce_scatter"] = [rs.item(), rst.item(), rss.item()]
    dist.barrier()
    dist.monitored_barrier()
    return out


def test_collectives_are_right(ranks: Ranks) -> None:
    r0, r1 = values(ranks.run(s_collectives))
    assert r0["broadcast"] == r1["broadcast"] == [7.0]
    assert r1["reduce"] == [2.0]
    assert r0["all_gather"] == r1["all_gather"] == [0.0, 1.0]
    assert r0["all_gather_single"] == [0.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    assert r1["gather"] == [0.0, 1.0] and r0["gather"] is None
    assert (r0["scatter"], r1["scatter"]) == (10.0, 11.0)
    assert r0["reduce_scatter"] == [2.0, 2.0, 6.0] and r1["reduce_scatter"] == [4.0, 4.0, 8.0]


def s_all_to_all(rank: int) -> dict[str, Any]:
    # uneven splits: rank 0 sends 1 row to itself and 2 to rank 1; rank 1 sends 3 and 1
    in_splits = [1, 2] if rank == 0 else [3, 1]
    out_splits = [1, 3] if rank == 0 else [2, 1]
    inp = torch.arange(sum(in_splits), dtype=torch.float32) + 10 * rank
    out = torch.zeros(sum(out_splits))
    dist.all_to_all_single(out, inp, out_splits, in_splits)
    even = torch.zeros(2)
    dist.all_to_all_single(even, torch.tensor([rank * 2.0, rank * 2.0 + 1]))
    # gloo's list form wants equal sizes (the matcher also allows uneven ones, for NCCL)
    ins = [torch.full((2,), float(10 * rank + j)) for j in range(2)]
    outs = [torch.zeros(2) for _ in range(2)]
    if GLOO_ALL_TO_ALL:
        dist.all_to_all(outs, ins)
    return {"single": out.tolist(), "even": even.tolist(), "lists": [o.tolist() for o in outs]}


def test_uneven_all_to_all(ranks: Ranks) -> None:
    r0, r1 = values(ranks.run(s_all_to_all))
    assert r0["single"] == [0.0, 10.0, 11.0, 12.0]
    assert r1["single"] == [1.0, 2.0, 13.0]
    assert r0["even"] == [0.0, 2.0] and r1["even"] == [1.0, 3.0]
    if GLOO_ALL_TO_ALL:
        assert r0["lists"] == [[0.0, 0.0], [10.0, 10.0]]
        assert r1["lists"] == [[1.0, 1.0], [11.0, 11.0]]


def s_objects(rank: int) -> dict[str, Any]:
    before = len(checked.events())
    gathered: list[Any] = [None, None]
    dist.all_gather_object(gathered, {"rank": rank})
    gl = [None, None] if rank == 0 else None
    dist.gather_object(f"r{rank}", gl, dst=0)
    bl = [1, "two", 3.0] if rank == 1 else [None, None, None]
    dist.broadcast_object_list(bl, src=1)
    sl: list[Any] = [None]
    dist.scatter_object_list(sl, ["a", "b"] if rank == 0 else None, src=0)
    ops = [e.op for e in checked.events()[before:]]
    return {"all": gathered, "gather": gl, "bcast": bl, "scatter": sl[0], "ops": ops}


def test_object_collectives(ranks: Ranks) -> None:
    r0, r1 = values(ranks.run(s_objects))
    assert r0["all"] == r1["all"] == [{"rank": 0}, {"rank": 1}]
    assert r0["gather"] == ["r0", "r1"]
    assert r0["bcast"] == r1["bcast"] == [1, "two", 3.0]
    assert (r0["scatter"], r1["scatter"]) == ("a", "b")
    # each runs two collectives inside (sizes, then data): both are checked, as that call
    expected = ["all_gather_object", "gather_object", "broadcast_object_list"]
    expected.append("scatter_object_list")
    assert list(dict.fromkeys(r0["ops"])) == expected
    assert len(r0["ops"]) > len(expected)


def s_p2p(rank: int) -> dict[str, Any]:
    peer = 1 - rank
    # blocking, in an order that only works because send waits for recv
    got = torch.zeros(3)
    if rank == 0:
        dist.send(torch.tensor([1.0, 2.0, 3.0]), dst=1)
        dist.recv(got, src=1)
    else:
        dist.recv(got, src=0)
        dist.send(got * 2, dst=0)
    # a ring with isend/irecv: both send first
    ring = torch.zeros(2)
    work = dist.isend(torch.full((2,), float(rank)), dst=peer)
    dist.irecv(ring, src=peer).wait()
    work.wait()
    # batch_isend_irecv
    batch = torch.zeros(1)
    ops = [
        dist.P2POp(dist.isend, torch.tensor([float(rank + 5)]), peer),
        dist.P2POp(dist.irecv, batch, peer),
    ]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    # from any source: unchecked, but keeps the channel counts in step
    anysrc = torch.zeros(1)
    if rank == 0:
        dist.send(torch.tensor([9.0]), dst=1)
    else:
        src = dist.recv(anysrc)
        assert src == 0
    after = torch.zeros(1)
    if rank == 0:
        dist.send(torch.tensor([4.0]), dst=1)
    else:
        dist.recv(after, src=0)
    return {
        "blocking": got.tolist(),
        "ring": ring.tolist(),
        "batch": batch.item(),
        "after": after.item(),
    }


def test_point_to_point(ranks: Ranks) -> None:
    r0, r1 = values(ranks.run(s_p2p))
    assert r1["blocking"] == [1.0, 2.0, 3.0] and r0["blocking"] == [2.0, 4.0, 6.0]
    assert r0["ring"] == [1.0, 1.0] and r1["ring"] == [0.0, 0.0]
    assert (r0["batch"], r1["batch"]) == (6.0, 5.0)
    assert r1["after"] == 4.0


def s_subgroups(rank: int) -> dict[str, Any]:
    both = dist.new_group([0, 1])
    only1 = dist.new_group([1])
    x = torch.ones(2)
    dist.all_reduce(x, group=both)
    y = torch.ones(1)
    dist.all_reduce(y, group=only1)  # rank 0 is not a member: torch skips it, so do we
    z = torch.ones(1)
    dist.broadcast(z, src=1, group=both)  # src is a global rank
    ev = [(e.group, e.seq, e.op) for e in checked.events()[-3:]]
    return {"x": x.tolist(), "y": y.item(), "events": ev}


def test_subgroups_have_their_own_seq(ranks: Ranks) -> None:
    r0, r1 = values(ranks.run(s_subgroups))
    assert r0["x"] == [2.0, 2.0] and r1["y"] == 1.0
    groups = {g for g, _, _ in r1["events"]}
    assert "WORLD" not in groups and len(groups) == 2
    both = [e for e in r0["events"] if e[0] == r1["events"][0][0]]
    assert [seq for _, seq, _ in both[-2:]] == [0, 1]


def s_async(rank: int) -> dict[str, Any]:
    x = torch.full((4,), float(rank))
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    deadline = time.monotonic() + 30  # a bound on a busy machine; it comes at once
    while checked.events()[-1].end_ns == 0 and time.monotonic() < deadline:
        time.sleep(0.001)  # the end time comes from the work's future callback
    e = checked.events()[-1]
    return {"x": x.tolist(), "ordered": e.arrive_ns <= e.start_ns <= e.end_ns}


def test_async_op(ranks: Ranks) -> None:
    for r in values(ranks.run(s_async)):
        assert r == {"x": [1.0] * 4, "ordered": True}


def s_ddp_bucket_end(rank: int) -> dict[str, Any]:
    """DDP's bucket all_reduce comes from C++ through the ops' kernels, its work boxed: its end
    is when the data arrived (the work's future), not when it was enqueued. Rank 1 starts its
    backward half a second late: rank 0's bucket cannot have its data before then (one
    machine, one monotonic clock), whatever the load."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from distnb.rank.checked.checker import end_when_done

    model = DDP(torch.nn.Linear(2048, 2048, bias=False))  # one 16 MiB bucket
    loss = model(torch.ones(1, 2048)).sum()
    if rank == 1:
        time.sleep(0.5)
    backward_ns = time.monotonic_ns()
    loss.backward()
    deadline = time.monotonic() + 60  # a bound on a busy machine; it comes at once
    while checked.events()[-1].end_ns == 0 and time.monotonic() < deadline:
        time.sleep(0.001)  # the future's callback runs on gloo's thread
    bucket = checked.events()[-1]
    return {
        "op": bucket.op,
        "origin": bucket.origin,
        "backward_ns": backward_ns,
        "end_ns": bucket.end_ns,
        "not a work": end_when_done(dist.group.WORLD.boxed(), []),
    }


def test_ddp_bucket_ends_when_its_data_arrived(ranks: Ranks) -> None:
    r0, r1 = values(ranks.run(s_ddp_bucket_end))
    for r in (r0, r1):
        assert r["op"] == "all_reduce" and r["origin"] == "DDP gradient bucket 0 (weight)"
        assert r["not a work"] is False
    assert r0["end_ns"] > r1["backward_ns"], "rank 0's bucket ended before rank 1 sent its data"


def s_ddp_buckets_of_the_model_forwarded(rank: int) -> list[str]:
    """An older DDP model on the same group, still alive, does not lend its parameter names to
    a newer model's buckets: each backward's bucket is the model forwarded last."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    old = DDP(torch.nn.Linear(4, 2))
    new = DDP(torch.nn.Sequential(torch.nn.Linear(4, 2)))
    origins = []
    for model in (new, old, new):
        model(torch.ones(1, 4)).sum().backward()
        origins.append(next(e.origin for e in reversed(checked.events()) if e.op == "all_reduce"))
    return origins


def test_ddp_buckets_are_named_by_the_model_forwarded_last(ranks: Ranks) -> None:
    for origins in values(ranks.run(s_ddp_buckets_of_the_model_forwarded)):
        assert origins == [
            "DDP gradient bucket 0 (0.bias, 0.weight)",
            "DDP gradient bucket 0 (bias, weight)",
            "DDP gradient bucket 0 (0.bias, 0.weight)",
        ]


def s_ddp(rank: int) -> list[float]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 2))  # nothing to register: its buckets are checked
    inp = torch.full((3, 4), float(rank + 1))
    model(inp).sum().backward()
    grad = model.module.weight.grad
    assert grad is not None
    ops = [e.op for e in checked.events()[-2:]]
    assert "all_reduce" in ops
    return grad.flatten().tolist()


def test_ddp_step_with_checked_hook(ranks: Ranks) -> None:
    g0, g1 = values(ranks.run(s_ddp))
    assert g0 == g1
    # d(sum)/dW = 3 rows of inputs summed: 3 on rank 0, 6 on rank 1; averaged: 4.5
    assert g0 == pytest.approx([4.5] * 8)


def s_events(rank: int, cell: int) -> list[dict[str, Any]]:
    checked.begin_run(cell)
    x = torch.ones(2)
    dist.all_reduce(x)
    dist.broadcast(x, src=0)
    return [e.to_dict() for e in checked.events(since_run=cell)]


def test_events_record_each_collective(ranks: Ranks) -> None:
    e0, e1 = values(ranks.run(s_events, cell=501))
    assert [e["op"] for e in e0] == ["all_reduce", "broadcast"]
    assert [e["seq"] for e in e0] == [e["seq"] for e in e1]
    for e in e0:
        assert e["run_id"] == 501 and e["group"] == "WORLD" and e["group_size"] == 2
        assert e["arrive_ns"] <= e["start_ns"] <= e["end_ns"]
        assert e["site"]["file"] == __file__ and e["site"]["code"].startswith("dist.")


# --- mismatches: every rank raises the same error, nothing moves, the group still works ----


def _meta_or_cpu(rank: int) -> torch.Tensor:
    return torch.zeros(4) if rank == 0 else torch.zeros(4, device="meta")


CASES: dict[str, Callable[[int], Any]] = {
    "op type": lambda r: dist.all_reduce(torch.zeros(4)) if r == 0 else dist.barrier(),
    "shape": lambda r: dist.all_reduce(torch.zeros(8 if r == 0 else 4)),
    "dtype": lambda r: dist.all_reduce(torch.zeros(4, dtype=torch.float32 if r else torch.int64)),
    "device": lambda r: dist.broadcast(_meta_or_cpu(r), src=0),
    "reduce op": lambda r: dist.all_reduce(
        torch.zeros(4), op=dist.ReduceOp.SUM if r == 0 else dist.ReduceOp.MAX
    ),
    "root": lambda r: dist.broadcast(torch.zeros(4), src=r),
    "split sizes": lambda r: dist.all_to_all_single(torch.zeros(3), torch.zeros(3), [1, 2], [1, 2]),
    "count": lambda r: dist.broadcast_object_list([None] * (2 + r), src=0),
    "all_gather_single output": lambda r: ALL_GATHER_SINGLE(torch.zeros(2), torch.zeros(2)),
    # `dist.*` is checked at the group's method, the method's other overloads at the op's kernel:
    # one check all the same
    "paths": lambda r: [dist.all_reduce, dist.group.WORLD.allreduce][r](torch.ones(8 >> r)),
}
KINDS = {
    "op type": "op type",
    "shape": "shape",
    "dtype": "dtype",
    "device": "device",
    "reduce op": "reduce op",
    "root": "root",
    "split sizes": "split sizes",
    "count": "count",
    "all_gather_single output": "shape",
    "paths": "shape",
}


def s_mismatch(rank: int, case: str) -> None:
    CASES[case](rank)


@pytest.mark.parametrize("case", list(CASES))
def test_mismatch_raises_on_every_rank(ranks: Ranks, case: str) -> None:
    outcomes = ranks.run(s_mismatch, case=case)
    for o in outcomes:
        assert o.error == "CollectiveMismatchError", o.message
        assert o.data["kind"] == KINDS[case]
        assert "rank 0:" in o.message and "rank 1:" in o.message
        assert "CASES[case](rank)" not in o.message  # the site is the user's line, in CASES
        assert "lambda r:" in o.message
    assert outcomes[0].message == outcomes[1].message
    # nothing was dispatched, so gloo is fine and the ranks are still in step
    assert values(ranks.run(s_all_reduce)) == [[3.0] * 8, [3.0] * 8]


def s_skip(rank: int) -> None:
    if rank == 0:
        dist.all_reduce(torch.zeros(4))
    dist.barrier()


def test_skipped_collective_gets_a_hint(ranks: Ranks) -> None:
    outcomes = ranks.run(s_skip)
    for o in outcomes:
        assert o.data["kind"] == "op type"
        assert "may have skipped a collective" in o.message
    assert values(ranks.run(s_all_reduce)) == [[3.0] * 8, [3.0] * 8]


def s_non_finite(rank: int) -> None:
    x = torch.ones(4)
    if rank == 1:
        x[2] = float("nan")
    with checked.finite_checks():
        dist.all_reduce(x)


def test_non_finite_input_is_refused(ranks: Ranks) -> None:
    outcomes = ranks.run(s_non_finite)
    for o in outcomes:
        assert o.error == "CollectiveMismatchError"
        assert o.data["kind"] == "non-finite input" and o.data["ranks"] == [1]
    assert values(ranks.run(s_all_reduce)) == [[3.0] * 8, [3.0] * 8]


def s_p2p_mismatch(rank: int, blocking: bool) -> None:
    if rank == 0:
        t = torch.ones(4)
        if blocking:
            dist.send(t, dst=1)
        else:
            dist.isend(t, dst=1).wait()
    else:
        dist.recv(torch.zeros(2, 2), src=0)


@pytest.mark.parametrize("blocking", [True, False])
def test_p2p_mismatch(ranks: Ranks, blocking: bool) -> None:
    o0, o1 = ranks.run(s_p2p_mismatch, blocking=blocking)
    assert o1.error == "CollectiveMismatchError" and o1.data["kind"] == "shape"
    assert "rank 0 sends float32[4], rank 1 receives into float32[2, 2]" in o1.message
    if blocking:  # a blocking send learns the receiver's verdict; an isend cannot
        assert o0.error == "CollectiveMismatchError" and o0.message == o1.message
    else:
        assert o0.error == ""
    assert values(ranks.run(s_p2p))[1]["after"] == 4.0


# --- ranks that wait for each other in different calls: raised, not hung -------------------


def s_deadlock(rank: int, case: str) -> dict[str, Any]:
    g = dist.new_group([0, 1])
    t0 = time.monotonic()
    try:
        if case == "group":
            dist.all_reduce(torch.zeros(2), group=g if rank == 1 else None)
        elif case == "peer":
            dist.recv(torch.zeros(2), src=1 - rank)
        else:  # one rank receives, the other went on to a collective
            if rank == 0:
                dist.recv(torch.zeros(2), src=1)
            else:
                dist.all_reduce(torch.zeros(2))
    except Exception as exc:
        mismatch = getattr(exc, "mismatch", None)
        return {
            "error": type(exc).__name__,
            "message": str(exc),
            "kind": mismatch.kind.value if mismatch else "",
            "seconds": time.monotonic() - t0,
        }
    return {"error": ""}


@pytest.mark.parametrize(
    ("case", "kind"), [("group", "group"), ("peer", "peer"), ("mixed", "op type")]
)
def test_waits_that_can_never_end_raise(ranks: Ranks, case: str, kind: str) -> None:
    r0, r1 = values(ranks.run(s_deadlock, case=case))
    for r in (r0, r1):
        assert r["error"] == "CollectiveMismatchError" and r["kind"] == kind
        assert r["seconds"] < NAMED_S  # named, not left to the process group's 60 s timeout
        assert "each waits for the other" in r["message"]
    assert r0["message"] == r1["message"]
    # both took their calls back: collectives and messages line up again
    assert values(ranks.run(s_all_reduce)) == [[3.0] * 8, [3.0] * 8]
    assert values(ranks.run(s_p2p))[1]["after"] == 4.0


# --- a rank that never arrives: the kernel's abort key, Ctrl-C ------------------------------


def s_wait_alone(rank: int, cell: int) -> dict[str, Any]:
    checked.begin_run(cell)
    if rank == 0:
        try:
            dist.all_reduce(torch.zeros(4))
        except KeyboardInterrupt:
            return {"raised": "KeyboardInterrupt", "at": time.monotonic_ns()}
    return {"raised": "", "at": time.monotonic_ns()}


def waiting_beacon(ranks: Ranks, rank: int, cell: int) -> Beacon:
    """`rank`'s beacon once it says the rank waits at a collective in `cell` (polled: the rank
    writes it on its own; bounded by NAMED_S)."""
    deadline = time.monotonic() + NAMED_S
    while True:
        beacon = Beacon.from_json(ranks.store.get(keys.beacon(rank)))
        waits = beacon.state is BeaconState.WAITING and beacon.run_id == cell
        if waits or time.monotonic() > deadline:
            return beacon
        time.sleep(0.01)


def test_abort_key_releases_a_waiting_rank(ranks: Ranks) -> None:
    ranks.start(s_wait_alone, [0], cell=901)
    (o1,) = ranks.run(s_wait_alone, [1], cell=901)
    assert o1.error == ""
    beacon = waiting_beacon(ranks, 0, 901)
    assert beacon.state is BeaconState.WAITING and beacon.op == "all_reduce"
    assert beacon.waiting_for == (1,) and beacon.run_id == 901
    reason = "rank 1 finished the cell without calling all_reduce #7"
    ranks.store.set(keys.abort(901), reason)
    (o0,) = ranks.collect([0], timeout=NAMED_S)
    assert o0.error == "CollectiveDesyncError"
    assert reason in o0.message
    assert o0.seconds < NAMED_S  # released by the key, not by the group's 60 s timeout
    # the waiter took its fingerprint back: both ranks are in step again
    assert values(ranks.run(s_all_reduce)) == [[3.0] * 8, [3.0] * 8]
    assert Beacon.from_json(ranks.store.get(keys.beacon(0))).state is BeaconState.RUNNING


def test_ctrl_c_interrupts_a_waiting_rank(ranks: Ranks) -> None:
    ranks.start(s_wait_alone, [0], cell=902)
    ranks.run(s_wait_alone, [1], cell=902)
    assert waiting_beacon(ranks, 0, 902).state is BeaconState.WAITING
    sent = time.monotonic_ns()
    ranks.interrupt(0)
    (o0,) = ranks.collect([0], timeout=NAMED_S)
    assert o0.value["raised"] == "KeyboardInterrupt"
    assert (o0.value["at"] - sent) / 1e9 < NAMED_S  # released by the signal, not a timeout
    assert values(ranks.run(s_all_reduce)) == [[3.0] * 8, [3.0] * 8]


# --- install / uninstall ------------------------------------------------------------------------


def _checking_kernel(op: str) -> str:
    """Who registered the kernel `op` runs at the key distnb checks at (torch has none there)."""
    lines = torch._C._dispatch_dump(op).splitlines()
    return "distnb" if any(x.startswith("ADInplaceOrView:") for x in lines) else "torch"


def s_uninstall_restores(rank: int) -> dict[str, Any]:
    from torch.distributed import distributed_c10d as c10d

    assert installation._checker is not None
    store = installation._checker.store
    ops = ("c10d::allreduce_", "_c10d_functional::all_gather_into_tensor")
    before = [_checking_kernel(op) for op in ops]
    wrapped = dist.all_gather_object
    checked.uninstall()
    after = [_checking_kernel(op) for op in ops]
    restored = (
        dist.all_gather_object is not wrapped and c10d.all_gather_object is dist.all_gather_object
    )
    x = torch.ones(1)
    dist.all_reduce(x)
    checked.install(store, rank=rank, world_size=2, session_id=f"again{os.getppid()}")
    again = [_checking_kernel(op) for op in ops]
    return {"before": before, "after": after, "again": again, "restored": restored}


def test_uninstall_restores_torch(ranks: Ranks) -> None:
    for r in values(ranks.run(s_uninstall_restores)):
        assert r["before"] == r["again"] == ["distnb", "distnb"]
        assert r["after"] == ["torch", "torch"] and r["restored"]
    assert values(ranks.run(s_all_reduce)) == [[3.0] * 8, [3.0] * 8]


def s_store_path(rank: int) -> dict[str, Any]:
    """Ranks on different hosts (as `hosts` says) exchange fingerprints through the store."""
    from distnb.rank.checked import exchange

    checker = installation._checker
    assert checker is not None
    store, session = checker.store, checker.session_id
    checked.uninstall()
    checked.install(store, rank=rank, world_size=2, session_id=session, hosts=["h0", "h1"])
    try:
        x = torch.full((3,), float(rank + 1))
        dist.all_reduce(x)
        group = installation._checker.groups[dist.group.WORLD.group_name]
        assert group is not None
        board = group.board
        got = torch.zeros(2)
        if rank == 0:
            dist.send(torch.ones(2), dst=1)
        else:
            dist.recv(got, src=0)
        error = ""
        try:
            dist.broadcast(torch.zeros(2 + rank), src=0)
        except Exception as exc:
            error = exc.mismatch.kind.value
        y = torch.ones(1)
        dist.all_reduce(y)
        return {
            "store": isinstance(board, exchange.StoreBoard),
            "x": x.tolist(),
            "got": got.tolist(),
            "error": error,
            "y": y.item(),
        }
    finally:
        checked.uninstall()
        checked.install(store, rank=rank, world_size=2, session_id=session)


def test_store_path_across_hosts(ranks: Ranks) -> None:
    r0, r1 = values(ranks.run(s_store_path))
    for r in (r0, r1):
        assert r["store"] and r["x"] == [3.0] * 3 and r["error"] == "shape" and r["y"] == 2.0
    assert r1["got"] == [1.0, 1.0]
    assert values(ranks.run(s_all_reduce)) == [[3.0] * 8, [3.0] * 8]


def test_unchecked_passes_through(ranks: Ranks) -> None:
    for r in values(ranks.run(s_unchecked)):
        # the call ran (its sum is right) without being recorded; after the block, calls are
        # checked again (a mismatch raises) and numbered in step (the next all_reduce works)
        assert r == {"x": [3.0, 3.0], "recorded": 0, "after": "shape", "y": 2.0}


def s_unchecked(rank: int) -> dict[str, Any]:
    before = len(checked.events())
    x = torch.full((2,), float(rank + 1))
    with checked.unchecked():
        dist.all_reduce(x)
    recorded = len(checked.events()) - before
    after = ""
    try:
        dist.all_reduce(torch.ones(2 + rank))
    except Exception as exc:
        after = exc.mismatch.kind.value
    y = torch.ones(1)
    dist.all_reduce(y)
    return {"x": x.tolist(), "recorded": recorded, "after": after, "y": y.item()}


# --- torch.compile: checked, and traced without extra graph breaks ---------------------------


def s_compiled(rank: int) -> dict[str, Any]:
    import torch._dynamo

    def step(x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x)
        return x * 2

    torch._dynamo.reset()
    explained = torch._dynamo.explain(step)(torch.ones(4))
    compiled = torch.compile(step)
    before = len(checked.events())
    value = compiled(torch.full((4,), float(rank + 1)))
    return {
        "breaks": explained.graph_break_count,
        "value": value.tolist(),
        "checked": [e.origin for e in checked.events()[before:]],
    }


def test_compiled_collectives_are_checked_without_graph_breaks(ranks: Ranks) -> None:
    # the first compile of the session: ~40 s with torch 2.8's and 2.9's CUDA builds here
    for r in values(ranks.run(s_compiled, timeout=120)):
        assert r["breaks"] == 0  # tracing sees the patched functions as torch's own
        assert r["value"] == [6.0] * 4
        # the run, not the trace (fake tensors)
        assert [origin.split(",")[0] for origin in r["checked"]] == ["compiled graph"]
