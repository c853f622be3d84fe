"""The pure fingerprint matcher: every mismatch kind, every legal pattern, JSON round trips."""

from __future__ import annotations

import json
from typing import Any

import pytest

from distnb.judgement import canonical_op, deadlock, describe, match, match_p2p
from distnb.judgement.mismatch import SKIP_HINT
from distnb.records.collective import (
    CallSite,
    CollectiveEvent,
    Fingerprint,
    MatchKind,
    Mismatch,
    Param,
    TensorSpec,
)

F32 = "float32"


def t(*shape: int, dtype: str = F32, device: str = "cpu") -> TensorSpec:
    return TensorSpec(tuple(shape), dtype, device)


def fp(rank: int, op: str, *, line: int = 5, world: int = 2, **kw: Any) -> Fingerprint:
    site = CallSite("/tmp/ipykernel_1/7.py", line, cell=3, code=f"dist.{op}(...)")
    return Fingerprint(
        rank=rank, group="WORLD", seq=4, op=op, group_ranks=tuple(range(world)), site=site, **kw
    )


def same(op: str, world: int = 2, **kw: Any) -> list[Fingerprint]:
    return [fp(r, op, world=world, **kw) for r in range(world)]


def kind_of(fps: list[Fingerprint]) -> MatchKind | None:
    found = match(fps)
    return None if found is None else found.kind


MODEL = (Param("fc1.weight", t(32, 16)), Param("fc1.bias", t(32)), Param("fc2.weight", t(2, 32)))
WIDER = (Param("fc1.weight", t(48, 16)), Param("fc1.bias", t(48)), Param("fc2.weight", t(2, 48)))


# --- legal programs never raise ---------------------------------------------------------------

LEGAL = {
    "all_reduce": same("all_reduce", inputs=(t(8),), reduce_op="SUM"),
    "broadcast from different lines": [
        fp(0, "broadcast", inputs=(t(3, 4),), root=0, line=2),
        fp(1, "broadcast", inputs=(t(3, 4),), root=0, line=9),
    ],
    "reduce": same("reduce", inputs=(t(4),), reduce_op="MAX", root=1),
    "barrier": same("barrier"),
    "all_gather": same("all_gather", inputs=(t(2, 3),), outputs=(t(2, 3), t(2, 3))),
    "all_gather uneven (per-rank sizes)": [
        fp(0, "all_gather", inputs=(t(2),), outputs=(t(2), t(5))),
        fp(1, "all_gather", inputs=(t(5),), outputs=(t(2), t(5))),
    ],
    "all_gather_single, concat or stack": [
        fp(0, "all_gather_single", inputs=(t(2, 3),), outputs=(t(4, 3),)),
        fp(1, "all_gather_into_tensor", inputs=(t(2, 3),), outputs=(t(2, 2, 3),)),
    ],
    "reduce_scatter_single": same(
        "reduce_scatter_single", inputs=(t(8, 2),), outputs=(t(4, 2),), reduce_op="SUM"
    ),
    "reduce_scatter list": same(
        "reduce_scatter", inputs=(t(3), t(3)), outputs=(t(3),), reduce_op="SUM"
    ),
    "gather: list on dst only": [
        fp(0, "gather", inputs=(t(4),), root=1),
        fp(1, "gather", inputs=(t(4),), outputs=(t(4), t(4)), root=1),
    ],
    "scatter: list on src only": [
        fp(0, "scatter", inputs=(t(2), t(2)), outputs=(t(2),), root=0),
        fp(1, "scatter", outputs=(t(2),), root=0),
    ],
    "all_to_all lists, uneven": [
        fp(0, "all_to_all", inputs=(t(1), t(2)), outputs=(t(1), t(3))),
        fp(1, "all_to_all", inputs=(t(3), t(4)), outputs=(t(2), t(4))),
    ],
    "all_to_all_single even": same("all_to_all_single", inputs=(t(4, 2),), outputs=(t(4, 2),)),
    "all_to_all_single uneven": [
        fp(
            0,
            "all_to_all_single",
            inputs=(t(3, 2),),
            outputs=(t(5, 2),),
            in_splits=(1, 2),
            out_splits=(1, 4),
        ),
        fp(
            1,
            "all_to_all_single",
            inputs=(t(7, 2),),
            outputs=(t(5, 2),),
            in_splits=(4, 3),
            out_splits=(2, 3),
        ),
    ],
    "all_gather_object": same("all_gather_object", count=2),
    "gather_object on dst only": [
        fp(0, "gather_object", root=0, count=2),
        fp(1, "gather_object", root=0),
    ],
    "broadcast_object_list": same("broadcast_object_list", root=1, count=3),
    "scatter_object_list": [
        fp(0, "scatter_object_list", root=0, count=2),
        fp(1, "scatter_object_list", root=0),
    ],
    "check_finite all finite": same("all_reduce", inputs=(t(8),), reduce_op="SUM", finite=True),
    "check_finite on one rank only": [
        fp(0, "all_reduce", inputs=(t(8),), reduce_op="SUM", finite=True),
        fp(1, "all_reduce", inputs=(t(8),), reduce_op="SUM"),
    ],
    "four ranks": same("all_reduce", world=4, inputs=(t(8),), reduce_op="SUM"),
}


@pytest.mark.parametrize("name", list(LEGAL))
def test_legal_programs_pass(name: str) -> None:
    assert match(LEGAL[name]) is None


def test_p2p_legal() -> None:
    send = fp(0, "isend", inputs=(t(4),), peer=1)
    recv = fp(1, "recv", outputs=(t(4),), peer=0)
    assert match_p2p(send, recv) is None


# --- every mismatch kind ----------------------------------------------------------------------

MISMATCHES: dict[str, tuple[list[Fingerprint], MatchKind, tuple[int, ...]]] = {
    "op type": (
        [fp(0, "all_reduce", inputs=(t(8),)), fp(1, "broadcast", inputs=(t(8),), root=0)],
        MatchKind.COLLECTIVE_TYPE,
        (0, 1),
    ),
    "shape": (
        [fp(0, "all_reduce", inputs=(t(8),)), fp(1, "all_reduce", inputs=(t(4),))],
        MatchKind.SHAPE,
        (0, 1),
    ),
    "shape, odd one out": (
        [fp(r, "all_reduce", world=3, inputs=(t(8 if r != 2 else 4),)) for r in range(3)],
        MatchKind.SHAPE,
        (2,),
    ),
    "dtype": (
        [fp(0, "all_reduce", inputs=(t(8),)), fp(1, "all_reduce", inputs=(t(8, dtype="int64"),))],
        MatchKind.DTYPE,
        (0, 1),
    ),
    "device": (
        [
            fp(0, "broadcast", inputs=(t(8),), root=0),
            fp(1, "broadcast", inputs=(t(8, device="cuda"),), root=0),
        ],
        MatchKind.DEVICE,
        (0, 1),
    ),
    "reduce op": (
        [
            fp(0, "all_reduce", inputs=(t(8),), reduce_op="SUM"),
            fp(1, "all_reduce", inputs=(t(8),), reduce_op="MAX"),
        ],
        MatchKind.REDUCE_OP,
        (0, 1),
    ),
    "root": (
        [fp(0, "broadcast", inputs=(t(8),), root=0), fp(1, "broadcast", inputs=(t(8),), root=1)],
        MatchKind.ROOT,
        (0, 1),
    ),
    "gather list on a non-dst rank": (
        [
            fp(0, "gather", inputs=(t(4),), outputs=(t(4), t(4)), root=1),
            fp(1, "gather", inputs=(t(4),), outputs=(t(4), t(4)), root=1),
        ],
        MatchKind.ROOT,
        (0,),
    ),
    "scatter list on a non-src rank": (
        [
            fp(0, "scatter", inputs=(t(2), t(2)), outputs=(t(2),), root=0),
            fp(1, "scatter", inputs=(t(2), t(2)), outputs=(t(2),), root=0),
        ],
        MatchKind.ROOT,
        (1,),
    ),
    "split sizes": (
        [
            fp(
                0,
                "all_to_all_single",
                inputs=(t(3),),
                outputs=(t(3),),
                in_splits=(1, 2),
                out_splits=(1, 2),
            ),
            fp(
                1,
                "all_to_all_single",
                inputs=(t(3),),
                outputs=(t(3),),
                in_splits=(1, 2),
                out_splits=(1, 2),
            ),
        ],
        MatchKind.SPLIT_SIZES,
        (0, 1),
    ),
    "split sizes that do not add up": (
        [
            fp(0, "all_to_all_single", inputs=(t(4),), outputs=(t(4),), in_splits=(1, 2)),
            fp(1, "all_to_all_single", inputs=(t(4),), outputs=(t(4),)),
        ],
        MatchKind.SPLIT_SIZES,
        (0,),
    ),
    "all_gather output list too short": (
        same("all_gather", inputs=(t(2),), outputs=(t(2),)),
        MatchKind.SHAPE,
        (0,),
    ),
    "all_gather_single output too small": (
        same("all_gather_single", inputs=(t(4),), outputs=(t(4),)),
        MatchKind.SHAPE,
        (0,),
    ),
    "reduce_scatter_single input too small": (
        same("reduce_scatter_single", inputs=(t(4),), outputs=(t(4),), reduce_op="SUM"),
        MatchKind.SHAPE,
        (0,),
    ),
    "all_to_all pairwise shapes": (
        [
            fp(0, "all_to_all", inputs=(t(1), t(2)), outputs=(t(1), t(3))),
            fp(1, "all_to_all", inputs=(t(4), t(4)), outputs=(t(2), t(4))),
        ],
        MatchKind.SHAPE,
        (0, 1),
    ),
    "group": (
        [
            fp(0, "all_reduce", inputs=(t(8),)),
            Fingerprint(1, "g1", 4, "all_reduce", (t(8),), group_ranks=(1, 2)),
        ],
        MatchKind.GROUP,
        (0, 1),
    ),
    "broadcast_object_list count": (
        [
            fp(0, "broadcast_object_list", root=0, count=2),
            fp(1, "broadcast_object_list", root=0, count=3),
        ],
        MatchKind.COUNT,
        (0, 1),
    ),
    "all_gather_object count": (
        [fp(0, "all_gather_object", count=2), fp(1, "all_gather_object", count=1)],
        MatchKind.COUNT,
        (1,),
    ),
    "gather_object list short on dst": (
        [fp(0, "gather_object", root=0, count=1), fp(1, "gather_object", root=0)],
        MatchKind.COUNT,
        (0,),
    ),
    "DDP model with a different hidden size": (
        [
            fp(0, "all_gather", inputs=(t(1),), outputs=(t(1), t(1)), params=MODEL),
            fp(1, "all_gather", inputs=(t(1),), outputs=(t(1), t(1)), params=WIDER),
        ],
        MatchKind.MODEL,
        (0, 1),
    ),
    "non-finite": (
        [
            fp(0, "all_reduce", inputs=(t(8),), reduce_op="SUM", finite=True),
            fp(1, "all_reduce", inputs=(t(8),), reduce_op="SUM", finite=False),
        ],
        MatchKind.NON_FINITE,
        (1,),
    ),
}


@pytest.mark.parametrize("name", list(MISMATCHES))
def test_mismatch_kinds(name: str) -> None:
    fps, kind, ranks = MISMATCHES[name]
    found = match(fps)
    assert found is not None
    assert found.kind is kind
    assert found.ranks == ranks
    # one line per rank, naming its call and its site
    for f in fps:
        assert f"rank {f.rank}: {describe(f)}" in found.message
    assert found.message.startswith(f"{kind.value} mismatch in ")


def test_every_kind_is_covered() -> None:
    covered = {kind for _, kind, _ in MISMATCHES.values()}
    p2p = match_p2p(fp(0, "send", inputs=(t(4),), peer=1), fp(1, "recv", outputs=(t(5),), peer=0))
    assert p2p is not None
    covered.add(p2p.kind)
    assert covered >= set(MatchKind) - {MatchKind.PEER}


def test_models_that_differ_are_named_by_parameter() -> None:
    found = match(MISMATCHES["DDP model with a different hidden size"][0])
    assert found is not None
    assert found.detail == (
        "parameter 'fc1.weight' is float32[32, 16] on rank 0 and float32[48, 16] on rank 1"
    )
    extra = (*MODEL, Param("fc3.weight", t(2, 2)))
    longer = [fp(r, "all_gather", params=p) for r, p in ((0, MODEL), (1, extra), (2, MODEL))]
    found = match(longer)
    assert found is not None and found.kind is MatchKind.MODEL and found.ranks == (1,)
    assert found.detail == (
        "rank 1's model has 4 parameters, rank 0's 3; the first one rank 0 lacks is "
        "'fc3.weight' (float32[2, 2])"
    )


def test_an_origin_is_said_once_or_per_rank() -> None:
    bucket = "DDP gradient bucket 0 (fc.bias, fc.weight)"
    same_origin = [fp(r, "all_reduce", inputs=(t(4 + r),), origin=bucket) for r in (0, 1)]
    found = match(same_origin)
    assert found is not None
    assert found.message.splitlines()[0].startswith(
        f"shape mismatch in all_reduce #4 on WORLD ({bucket}):"
    )
    mixed = [
        fp(
            0,
            "all_gather_single",
            inputs=(t(2),),
            outputs=(t(4),),
            origin="FSDP2 all-gather for layers.0",
        ),
        fp(
            1,
            "all_gather_single",
            inputs=(t(3),),
            outputs=(t(6),),
            origin="DTensor redistribute S(0) -> R",
        ),
    ]
    found = match(mixed)
    assert found is not None
    assert "[FSDP2 all-gather for layers.0]" in found.message
    assert "[DTensor redistribute S(0) -> R]" in found.message


def test_shape_message_names_ranks_sites_and_calls() -> None:
    found = match(MISMATCHES["shape"][0])
    assert found is not None
    assert found.message.splitlines() == [
        "shape mismatch in all_reduce #4 on WORLD: the tensors differ in shape "
        "(rank 0: [8], rank 1: [4])",
        "  rank 0: all_reduce(float32[8])  at cell In[3] line 5: dist.all_reduce(...)",
        "  rank 1: all_reduce(float32[4])  at cell In[3] line 5: dist.all_reduce(...)",
        "Nothing was sent; the process group still works.",
    ]


def test_skipped_collective_hint() -> None:
    fps = [fp(0, "all_reduce", inputs=(t(8),), line=3), fp(1, "barrier", line=7)]
    found = match(fps)
    assert found is not None and found.hint == SKIP_HINT
    assert "may have skipped a collective" in found.message
    same_line = [fp(0, "all_reduce", inputs=(t(8),)), fp(1, "barrier")]
    assert match(same_line).hint == ""


def test_a_skipped_framework_call_is_said_in_the_frameworks_words() -> None:
    bucket = "DDP gradient bucket 0 (layer.bias, layer.weight)"
    logged = "Lightning self.log(sync_dist=True)"
    fps = [
        fp(0, "barrier", origin=logged, line=13),
        fp(1, "all_reduce", inputs=(t(5),), reduce_op="SUM", origin=bucket, line=24),
    ]
    found = match(fps)
    assert found is not None and found.kind is MatchKind.COLLECTIVE_TYPE
    assert found.message.splitlines()[0] == (
        "op type mismatch in barrier/all_reduce #4 on WORLD: rank 1 skipped the barrier that "
        f"{logged} makes on rank 0; its call here is all_reduce from {bucket}"
    )
    assert found.hint.startswith(f"{logged} makes a collective: every rank calls it")
    # many ranks: the side that skipped, grouped; a call with no origin is said bare
    many = [fp(r, "all_reduce", inputs=(t(1),), origin="Ignite metric sync") for r in (0, 1)]
    many += [fp(r, "barrier", line=9) for r in range(2, 8)]
    said = match(many)
    assert said is not None and said.detail == (
        "ranks 2-7 skipped the all_reduce that Ignite metric sync makes on ranks 0-1; their "
        "call here is barrier"
    )
    # a framework strategy's own call is its loop's: the other side's call is the one skipped
    loop = [fp(0, "all_gather", origin="Lightning self.all_gather", line=18)]
    loop += [fp(1, "barrier", origin="Lightning strategy.barrier", line=28)]
    assert match(loop).detail == (
        "rank 1 skipped the all_gather that Lightning self.all_gather makes on rank 0; its call "
        "here is barrier from Lightning strategy.barrier"
    )
    # both from the framework's loop at one line of the user's: the loops went different ways
    steps = [fp(0, "broadcast", origin="Lightning fit loop (each step's SIGTERM broadcast)")]
    steps += [fp(1, "barrier", origin="Lightning strategy.reduce")]
    assert "rank 0 calls broadcast, rank 1 calls barrier" in match(steps).message
    assert match(steps).hint.startswith("both calls come from Lightning's own loop")
    # both sides made by frameworks' functions, or neither: no side is known to have skipped
    both = [fps[0], fp(1, "all_gather", origin="Lightning self.all_gather", line=30)]
    assert "rank 0 calls barrier, rank 1 calls all_gather" in match(both).message
    assert match(both).hint == SKIP_HINT


def test_split_message_says_who_sends_what() -> None:
    found = match(MISMATCHES["split sizes"][0])
    assert found is not None
    assert "rank 0 sends 2 rows to rank 1, but rank 1 expects 1 row from rank 0" in found.detail


def test_p2p_mismatch() -> None:
    found = match_p2p(
        fp(0, "isend", inputs=(t(4),), peer=1), fp(1, "recv", outputs=(t(2, 2),), peer=0)
    )
    assert found is not None and found.kind is MatchKind.SHAPE
    assert "rank 0 sends float32[4], rank 1 receives into float32[2, 2]" in found.message
    dtype = match_p2p(
        fp(0, "send", inputs=(t(4),), peer=1),
        fp(1, "irecv", outputs=(t(4, dtype="int32"),), peer=0),
    )
    assert dtype is not None and dtype.kind is MatchKind.DTYPE


def test_deadlocks() -> None:
    world = fp(0, "all_reduce", inputs=(t(2),), reduce_op="SUM")
    sub = Fingerprint(1, "g1", 0, "all_reduce", (t(2),), reduce_op="SUM", group_ranks=(0, 1))
    recv0 = fp(0, "recv", outputs=(t(2),), peer=1, line=8)
    recv1 = fp(1, "recv", outputs=(t(2),), peer=0, line=8)
    assert deadlock(sub, world).kind is MatchKind.GROUP
    assert deadlock(recv0, recv1).kind is MatchKind.PEER
    mixed = deadlock(recv0, fp(1, "all_reduce", inputs=(t(2),), line=9))
    assert mixed.kind is MatchKind.COLLECTIVE_TYPE and mixed.hint == SKIP_HINT
    found = deadlock(sub, world)
    assert found == deadlock(world, sub)  # the same error, whichever rank finds it
    assert found.message.splitlines()[0] == (
        "group mismatch: rank 0 waits in all_reduce #4 on WORLD and rank 1 waits in "
        "all_reduce #0 on g1 (ranks 0-1); each waits for the other, so neither can go on"
    )
    assert found.group == "WORLD/g1"


def test_aliases() -> None:
    assert canonical_op("all_gather_into_tensor") == "all_gather_single"
    assert canonical_op("reduce_scatter_tensor") == "reduce_scatter_single"
    assert canonical_op("isend") == "send"


def test_describe() -> None:
    a2a = fp(0, "all_to_all_single", inputs=(t(3, 2),), outputs=(t(5, 2),), in_splits=(1, 2))
    assert describe(a2a) == (
        "all_to_all_single(out=float32[5, 2], in=float32[3, 2], out_splits=even, in_splits=[1, 2])"
    )
    assert describe(fp(1, "gather_object", root=0)) == "gather_object(no list, dst=0)"
    assert (
        describe(fp(0, "send", inputs=(t(4),), peer=1, tag=3)) == "send(float32[4], dst=1, tag=3)"
    )
    gather = fp(1, "gather", inputs=(t(4),), outputs=(t(4), t(4)), root=1)
    assert describe(gather) == "gather(out=[float32[4] x2], in=float32[4], dst=1)"


# --- records round trip through JSON ----------------------------------------------------------


def test_mismatch_json_round_trip() -> None:
    for fps, _, _ in MISMATCHES.values():
        found = match(fps)
        assert found is not None
        text = found.to_json()
        json.loads(text)  # plain JSON
        assert Mismatch.from_json(text) == found


def test_fingerprint_and_event_round_trip() -> None:
    f = fp(
        1,
        "all_to_all_single",
        inputs=(t(3, 2),),
        outputs=(t(5, 2),),
        in_splits=(1, 2),
        out_splits=None,
        finite=False,
        count=None,
        tag=2,
    )
    assert Fingerprint.from_dict(json.loads(json.dumps(f.to_dict()))) == f
    event = CollectiveEvent(0, "WORLD", 3, "all_reduce", 32, CallSite("x.py", 2), 1, 2, 3, 7, 2)
    assert CollectiveEvent.from_dict(json.loads(json.dumps(event.to_dict()))) == event
