"""The record codec: every record round-trips through strict JSON (pure, milliseconds)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from distnb.records.cell import EngineProbe, RankFailure, RankInfo, RankReport, RankSpec, RankState
from distnb.records.codec import decode, dumps_many, encode
from distnb.records.collective import (
    CallSite,
    CollectiveEvent,
    Fingerprint,
    MatchKind,
    Mismatch,
    TensorSpec,
)
from distnb.records.doctor import Bandwidth, DoctorReport
from distnb.records.overflow import Frame, Phase, RankOverflowReport, summarize
from distnb.records.shapes import ModuleMeta, ShapeScan, TensorMeta

SITE = CallSite("train.py", 12, cell=3, code="dist.all_reduce(x)")
SPEC = TensorSpec((4, 2), "float32", "cuda")
FP = Fingerprint(
    rank=1,
    group="g1",
    seq=7,
    op="all_to_all_single",
    inputs=(SPEC,),
    outputs=(TensorSpec((), "int64"),),
    reduce_op="sum",
    root=0,
    peer=None,
    in_splits=(1, 3),
    out_splits=None,
    count=2,
    finite=False,
    tag=5,
    group_ranks=(0, 1),
    site=SITE,
)


def frame(abs_max: float = math.inf, **kw: Any) -> Frame:
    base: dict[str, Any] = {
        "step": 2,
        "micro": 0,
        "order": 5,
        "module": "layers.0",
        "cls": "Linear",
        "phase": Phase.BACKWARD,
        "name": "output",
        "dtype": "bfloat16",
        "compute_dtype": "float16",
        "numel": 8,
        "abs_min": math.nan,
        "abs_max": abs_max,
    }
    return Frame(**{**base, **kw})


TENSOR = TensorMeta("w", (3,), "float32", "cpu", requires_grad=True, has_nonfinite=None)
MODULE = ModuleMeta(
    "model", "Linear", True, 1, 3, 0, 0, ("float32",), ("cpu",), 1, 0, 0, None, (TENSOR,)
)
REPORTS = (
    RankOverflowReport(0, 3, 3, first=None, ring=(frame(1.5),), stats="full"),
    RankOverflowReport(
        1,
        3,
        3,
        first=frame(),
        ring=(frame(-math.inf, headroom_bits=math.inf),),
        stopped="nonfinite",
    ),
)

SAMPLES = [
    RankInfo(0, 0, 4, "node1", 123, "cuda:0", "nccl"),
    RankFailure(2, "ValueError", "bad", "Traceback ..."),
    RankReport(3, RankState.RUNNING, "all_reduce #4", "stack"),
    RankSpec(1, 2, 1, 2, "gloo", "127.0.0.1", 29500, "s1", check=False, pg_timeout_s=30.0),
    EngineProbe(7, "node2", 99, 2, mpi_rank=None),
    EngineProbe(7, "node2", 99, 2, mpi_rank=3),
    SITE,
    CollectiveEvent(0, "WORLD", 3, "all_reduce", 64, SITE, 10, 20, 30, run_id=4, group_size=2),
    SPEC,
    FP,
    Mismatch(MatchKind.SPLIT_SIZES, "all_to_all_single", "g1", 7, (FP, FP), "msg", ranks=(1,)),
    frame(),
    frame(math.nan, abs_min=None, min_nonzero=-math.inf, nan=1, inf=0, headroom_bits=-3.5),
    *REPORTS,
    summarize(REPORTS),
    TENSOR,
    MODULE,
    ShapeScan(1, (TENSOR, MODULE, TENSOR), "cuda:1", truncated=2, not_found=("y",)),
    Bandwidth(1 << 20, 0.001, 2.5),
    DoctorReport(
        0, "node1", 1, "cpu", "gloo", (("torch", "2.4"),), ("slow",), (Bandwidth(8, 1e-6, 0.1),)
    ),
]


@pytest.mark.parametrize("record", SAMPLES, ids=lambda r: type(r).__name__)
def test_every_record_round_trips_through_strict_json(record: Any) -> None:
    text = json.dumps(encode(record), allow_nan=False)
    back = decode(type(record), json.loads(text))
    # NaN != NaN, so compare the JSON forms; they are equal only if every value came back
    assert type(back) is type(record)
    assert json.dumps(encode(back), allow_nan=False) == text
    if '"nan"' not in text:
        assert back == record


def test_non_finite_floats_are_written_as_strings_and_read_back() -> None:
    f = frame(math.nan, abs_min=math.inf, min_nonzero=-math.inf)
    d = encode(f)
    assert (d["abs_max"], d["abs_min"], d["min_nonzero"], d["headroom_bits"]) == (
        "nan",
        "inf",
        "-inf",
        None,
    )
    back = decode(Frame, json.loads(json.dumps(d, allow_nan=False)))
    assert math.isnan(back.abs_max) and back.abs_min == math.inf
    assert back.min_nonzero == -math.inf and back.headroom_bits is None


def test_methods_are_the_codec() -> None:
    assert FP.to_dict() == encode(FP)
    assert Fingerprint.from_dict(FP.to_dict()) == FP
    assert TENSOR.to_dict()["kind"] == "tensor" and MODULE.to_dict()["kind"] == "module"
    assert encode(SITE) == {"file": "train.py", "line": 12, "cell": 3, "code": SITE.code}
    assert encode(SAMPLES[2])["state"] == "running"


@dataclass(frozen=True, slots=True)
class Keyed:
    by_rank: Mapping[int, Frame]
    names: dict[str, tuple[int, str]]
    states: dict[RankState, float] = field(default_factory=dict)
    extra: Any = None
    pair: tuple[int, float | None] = (0, None)


def test_int_keyed_mappings_fixed_tuples_and_any() -> None:
    k = Keyed(
        by_rank={0: frame(2.0, abs_min=0.0), 3: frame(4.0, abs_min=1.0)},
        names={"a": (1, "x")},
        states={RankState.DIED: math.inf},
        extra={"raw": [1, 2]},
        pair=(2, -math.inf),
    )
    data = json.loads(json.dumps(encode(k), allow_nan=False))
    assert set(data["by_rank"]) == {"0", "3"} and data["states"] == {"died": "inf"}
    back = decode(Keyed, data)
    assert back == k
    assert list(back.by_rank) == [0, 3] and back.names["a"] == (1, "x")


def test_missing_keys_take_the_field_default() -> None:
    back = decode(Fingerprint, {"rank": 0, "group": "WORLD", "seq": 1, "op": "barrier"})
    assert back == Fingerprint(0, "WORLD", 1, "barrier")
    assert back.site == CallSite("", 0)


def test_errors_name_the_record_and_field() -> None:
    with pytest.raises(ValueError, match="CallSite needs 'line'"):
        decode(CallSite, {"file": "f.py"})
    with pytest.raises(ValueError, match=r"CollectiveEvent\.site: CallSite needs 'file'"):
        decode(CollectiveEvent, {**encode(SAMPLES[7]), "site": {"line": 1}})
    with pytest.raises(ValueError, match=r"ShapeScan\.entries: unknown kind 'blob'"):
        decode(ShapeScan, {"rank": 0, "entries": [{"kind": "blob"}]})
    with pytest.raises(ValueError, match=r"TensorSpec\.dtype: found null"):
        decode(TensorSpec, {"shape": [], "dtype": None})


def test_a_groups_members_are_written_as_runs_and_shared_once_decoded() -> None:
    world = tuple(range(4096))
    records = [replace(FP, seq=s, group_ranks=world) for s in range(3)]
    payload = json.loads(dumps_many(records))
    assert [p["group_ranks"] for p in payload] == [[[0, 4095]]] * 3  # not 4,096 numbers each
    back = [decode(Fingerprint, p) for p in payload]
    assert back == records
    assert back[0].group_ranks is back[1].group_ranks is back[2].group_ranks
    odd = replace(FP, group_ranks=(5, 6, 7, 0, 2, 3))  # a group's order is its group ranks'
    assert encode(odd)["group_ranks"] == [[5, 7], [0, 0], [2, 3]]
    assert decode(Fingerprint, encode(odd)).group_ranks == (5, 6, 7, 0, 2, 3)
    assert decode(Fingerprint, encode(FP) | {"group_ranks": [3, 1]}).group_ranks == (3, 1)
