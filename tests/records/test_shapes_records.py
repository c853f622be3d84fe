"""Shape-scan records: JSON round trips and derived properties (pure, milliseconds)."""

from __future__ import annotations

import json

import pytest

from distnb.records.shapes import ModuleMeta, ShapeScan, TensorMeta, entry_from_dict


def tensor(name: str = "x", **kw: object) -> TensorMeta:
    base: dict[str, object] = {"shape": (2, 3), "dtype": "float32", "device": "cpu"}
    return TensorMeta(name=name, **{**base, **kw})


def module() -> ModuleMeta:
    return ModuleMeta(
        name="model",
        type_name="Linear",
        training=True,
        n_params=2,
        param_numel=12,
        n_buffers=0,
        buffer_numel=0,
        dtypes=("float32",),
        devices=("cpu",),
        n_requires_grad=2,
        n_grads=1,
        n_nonfinite=0,
        n_grads_nonfinite=1,
        params=(tensor("weight", requires_grad=True), tensor("bias", shape=(3,))),
    )


def test_tensor_meta_round_trips_through_json() -> None:
    t = tensor(requires_grad=True, has_nonfinite=True, has_grad=True, grad_nonfinite=False)
    assert TensorMeta.from_dict(json.loads(json.dumps(t.to_dict()))) == t


def test_scalar_shape_and_numel() -> None:
    assert tensor(shape=()).numel == 1
    assert tensor(shape=(4, 0)).numel == 0
    assert TensorMeta.from_dict(tensor(shape=()).to_dict()).shape == ()


def test_module_meta_round_trips_with_its_parameters() -> None:
    m = module()
    back = entry_from_dict(json.loads(json.dumps(m.to_dict())))
    assert back == m
    assert isinstance(back, ModuleMeta) and back.params[1].shape == (3,)


def test_module_nonfinite_is_unknown_when_not_checked() -> None:
    assert module().has_nonfinite is True
    unchecked = ModuleMeta("m", "Linear", True, 0, 0, 0, 0, (), (), 0, 0)
    assert unchecked.has_nonfinite is None


def test_scan_round_trips_and_keeps_entry_order() -> None:
    scan = ShapeScan(
        rank=1,
        entries=(tensor("b"), module(), tensor("a")),
        device="cuda:1",
        truncated=3,
        not_found=("missing_name",),
    )
    back = ShapeScan.from_dict(json.loads(json.dumps(scan.to_dict())))
    assert back == scan
    assert [e.name for e in back.entries] == ["b", "model", "a"]


def test_unknown_entry_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown shape-scan entry kind 'blob'"):
        entry_from_dict({"kind": "blob"})
