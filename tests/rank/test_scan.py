"""Scanning a namespace of real tensors and modules in one process (no ranks needed)."""

from __future__ import annotations

import json
import math
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from torch import nn

from distnb.rank.scan import nonfinite_flags, scan_namespace
from distnb.records.shapes import ModuleMeta, ShapeScan, TensorMeta
from distnb.views.shape_table import build_table


def by_name(scan: ShapeScan) -> dict[str, TensorMeta | ModuleMeta]:
    return {e.name: e for e in scan.entries}


def test_tensors_in_a_namespace_and_inside_containers() -> None:
    Pair = namedtuple("Pair", "a b")
    ns = {
        "x": torch.zeros(3, 4),
        "batch": {"x": torch.ones(2, dtype=torch.int64), "meta": {"m": [torch.zeros(1)]}},
        "xs": [torch.zeros(1), "not a tensor", (torch.zeros(2),)],
        "pair": Pair(torch.zeros(5), 7),
        "_hidden": torch.zeros(1),
        "Out": {1: torch.zeros(1)},
        "math": math,
        "fn": by_name,
    }
    got = by_name(scan_namespace(ns, rank=0))
    assert list(got) == ["x", 'batch["x"]', 'batch["meta"]["m"][0]', "xs[0]", "xs[2][0]", "pair[0]"]
    x = got["x"]
    assert isinstance(x, TensorMeta)
    assert (x.shape, x.dtype, x.device, x.requires_grad, x.has_nonfinite) == (
        (3, 4),
        "float32",
        "cpu",
        False,
        False,
    )
    assert got['batch["x"]'].dtype == "int64"


def test_include_all_and_explicit_names() -> None:
    ns = {"_h": torch.zeros(1), "x": torch.zeros(1), "model": nn.Linear(2, 3)}
    assert "_h" in by_name(scan_namespace(ns, include_all=True, rank=0))
    scan = scan_namespace(ns, ["_h", "model.weight", "nope", "model.nope"], rank=3)
    assert list(by_name(scan)) == ["_h", "model.weight"]
    assert scan.not_found == ("nope", "model.nope")
    assert scan.rank == 3


def test_nan_inf_and_gradients() -> None:
    w = torch.ones(3, requires_grad=True)
    w.grad = torch.tensor([0.0, math.inf, 0.0])
    y = w * 2  # not a leaf: its .grad is not read (torch would warn)
    ns = {"w": w, "y": y, "nan": torch.tensor([1.0, math.nan]), "h": torch.ones(2).half()}
    got = by_name(scan_namespace(ns, rank=0))
    gw = got["w"]
    assert isinstance(gw, TensorMeta)
    assert (gw.has_nonfinite, gw.has_grad, gw.grad_nonfinite) == (False, True, True)
    assert got["y"].requires_grad and not got["y"].has_grad
    assert got["nan"].has_nonfinite is True
    assert got["h"].has_nonfinite is False


def test_nonfinite_check_can_be_switched_off() -> None:
    got = by_name(scan_namespace({"x": torch.tensor([math.nan])}, nonfinite=False, rank=0))
    assert got["x"].has_nonfinite is None


def test_nonfinite_flags_handles_odd_tensors() -> None:
    ts = [
        torch.tensor([1.0, math.nan]),
        torch.arange(3),
        torch.empty(0),
        torch.empty(2, device="meta"),
        torch.tensor([1 + 1j, complex(math.inf, 0)]),
        torch.tensor([1.0]).to(torch.float8_e4m3fn),  # no norm kernel: falls back to isfinite
        torch.zeros(2, 2).to_sparse(),
    ]
    flags = nonfinite_flags(ts)
    assert flags[:5] == [True, False, False, None, True]
    assert flags[5] in (False, None)
    assert flags[6] is None


def test_module_summary_with_grads_and_buffers() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    model(torch.randn(5, 4)).sum().backward()
    last = model[2]
    assert isinstance(last, nn.Linear) and last.bias.grad is not None
    with torch.no_grad():
        last.bias.grad[0] = math.nan
    m = by_name(scan_namespace({"model": model}, rank=0))["model"]
    assert isinstance(m, ModuleMeta)
    assert (m.type_name, m.n_params, m.n_buffers) == ("Sequential", 6, 3)
    assert m.param_numel == 4 * 8 + 8 + 8 + 8 + 8 * 2 + 2
    assert m.dtypes == ("float32", "int64")  # num_batches_tracked is int64
    assert (m.n_requires_grad, m.n_grads, m.n_nonfinite, m.n_grads_nonfinite) == (6, 6, 0, 1)
    assert [p.name for p in m.params][:2] == ["0.weight", "0.bias"]
    assert next(p for p in m.params if p.name == "2.bias").grad_nonfinite is True


def test_scan_is_metadata_only_and_json_round_trips() -> None:
    ns = {"x": torch.randn(100, 100), "model": nn.Linear(10, 10)}
    scan = scan_namespace(ns, rank=1)
    text = json.dumps(scan.to_dict())
    assert len(text) < 4_000  # 10,000 floats would not fit
    assert ShapeScan.from_dict(json.loads(text)) == scan


def test_containers_are_bounded_and_cycles_end() -> None:
    loop: list[object] = [torch.zeros(1)]
    loop.append(loop)
    deep = [[[[torch.zeros(1)]]]]
    many = [torch.zeros(1) for _ in range(300)]
    scan = scan_namespace({"loop": loop, "deep": deep, "many": many}, rank=0, max_items=256)
    names = list(by_name(scan))
    assert "loop[0]" in names and not any(n.startswith("loop[1]") for n in names)
    assert not any(n.startswith("deep") for n in names)  # 4 levels down, past MAX_DEPTH
    assert sum(n.startswith("many") for n in names) == 256
    assert scan.truncated == 44


def test_entry_limit_counts_what_it_leaves_out() -> None:
    ns = {f"t{i}": torch.zeros(1) for i in range(10)}
    scan = scan_namespace(ns, rank=0, max_entries=4)
    assert len(scan.entries) == 4 and scan.truncated == 6


def test_thousand_tensor_namespace_is_scanned_whole() -> None:
    # how long it takes is a figure bench/bench_views.py measures, not a test's to bound
    ns: dict[str, object] = {f"t{i}": torch.randn(16, 16) for i in range(1000)}
    ns["t500"] = torch.full((2,), math.inf)
    scans = [scan_namespace(ns, rank=r) for r in range(2)]
    table = build_table(scans)
    assert len(scans[0].entries) == 1000 and len(table.rows) == 1000
    assert table.rows[0].name == "t500" and table.rows[0].nonfinite


def test_module_with_thousands_of_parameters_is_scanned_whole() -> None:
    # timed in bench/bench_views.py too
    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(2000)])  # 4,000 parameters
    layer = model[1234]
    assert isinstance(layer, nn.Linear)
    with torch.no_grad():
        layer.weight[3, 3] = math.nan
    m = by_name(scan_namespace({"model": model}, rank=0))["model"]
    assert isinstance(m, ModuleMeta) and m.n_params == 4000 and m.n_nonfinite == 1
    assert [p.name for p in m.params if p.has_nonfinite] == ["1234.weight"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_own_device_is_the_current_cuda_device() -> None:
    x = torch.zeros(1, device="cuda")
    scan = scan_namespace({"x": x}, rank=0)
    assert scan.device == f"cuda:{torch.cuda.current_device()}"


def test_retained_grad_of_a_non_leaf_is_read() -> None:
    w = torch.ones(2, requires_grad=True)
    y = w * 2
    y.retain_grad()
    y.sum().backward()
    got = by_name(scan_namespace({"y": y}, rank=0))["y"]
    assert isinstance(got, TensorMeta) and got.has_grad and got.grad_nonfinite is False


def test_dtensor_is_checked_on_its_local_shard_without_a_collective(tmp_path: Path) -> None:
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed and no process group in this test process")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    init = f"file://{tmp_path / 'store'}"
    dist.init_process_group("gloo", init_method=init, rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        dt = distribute_tensor(torch.tensor([1.0, math.inf]), mesh, [Replicate()])
        got = by_name(scan_namespace({"dt": dt}, rank=0))["dt"]
        assert isinstance(got, TensorMeta) and got.shape == (2,) and got.has_nonfinite is True
    finally:
        dist.destroy_process_group()
