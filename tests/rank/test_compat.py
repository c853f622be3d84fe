"""Every torch distnb accepts: the interception registers the ops the installed torch has and
skips the rest, and `distnb doctor` says what that leaves unchecked. Real torch, real gloo ranks.

The op table a distnb release carries is written against the newest torch; an older torch lacks
some of its names (2.8 and 2.9 have no `_c10d_functional::isend`), and a newer one may add ops
distnb does not know yet (2.14's `c10d::gather_into_tensor_`). Here the table meets a name the
installed torch lacks the way it does in the field: `OPS` plus an op of a newer torch.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed import _functional_collectives as funcol

from distnb.rank import doctor
from distnb.rank.checked import installation, methods
from distnb.rank.checked.calls import Call, group_name, spec
from distnb.rank.checked.intercept import KEY, Context, Interceptor, resolve
from distnb.rank.checked.ops import OPS, UNREAD, Describe
from harness.gloo import Ranks


def gather_into_tensor_(
    out: torch.Tensor,
    inp: torch.Tensor,
    pg: Any,
    root: int,
    async_op: bool = True,
    timeout: int = -1,
) -> Call:
    """A describer for torch 2.14's `gather_single` op, as a newer table would carry one."""
    return Call("gather", group_name(pg), (spec(inp),), (spec(out),), root=root)


NEWER = "c10d::gather_into_tensor_"  # added in torch 2.14
TABLE: dict[str, Describe] = {**OPS, NEWER: gather_into_tensor_}


def dispatcher_has(name: str) -> bool:
    return name in torch._C._dispatch_get_all_op_names()


def registered(name: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(name, KEY)


def test_resolve_finds_only_ops_with_a_schema_their_describer_reads() -> None:
    assert resolve("c10d::allreduce_", OPS["c10d::allreduce_"]) is not None
    assert (resolve(NEWER, gather_into_tensor_) is None) != dispatcher_has(NEWER)
    assert resolve("_c10d_functional::no_such_op", gather_into_tensor_) is None
    assert resolve("no_such_namespace::op", gather_into_tensor_) is None

    def reads_one_argument(tensors: Any) -> Call:  # a schema that grew arguments since
        raise AssertionError("never called")

    assert resolve("c10d::allreduce_", reads_one_argument) is None


def test_install_registers_what_torch_has_and_names_the_rest() -> None:
    before = registered("c10d::allreduce_")  # another test's runtime in this process, if any
    interceptor = Interceptor(TABLE)
    interceptor.install(lambda call, dispatch: dispatch(), lambda call, dispatch: dispatch())
    try:
        lacking = tuple(name for name in TABLE if not dispatcher_has(name))
        assert interceptor.missing == lacking
        if torch.__version__ < "2.14":
            assert NEWER in interceptor.missing
        assert all(registered(name) for name in TABLE if name not in lacking)
    finally:
        interceptor.uninstall()
    assert registered("c10d::allreduce_") == before


def test_a_reduce_op_the_kernels_cannot_read_comes_from_the_python_caller() -> None:
    """Torch 2.8 and 2.9 box a ReduceOp unreadably (`ops.READS_REDUCE_OP`): a group method's
    other overloads say theirs through the context, read from the arguments as passed."""
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MIN
    assert methods._said_reduce_op((torch.ones(2), dist.ReduceOp.MAX)) == "MAX"
    assert methods._said_reduce_op(([torch.ones(2)], opts)) == "MIN"
    assert methods._said_reduce_op((torch.ones(2),)) == "SUM"  # each overload's default
    unread, read = (
        Call("all_reduce", "0", reduce_op=UNREAD),
        Call("all_reduce", "0", reduce_op="SUM"),
    )
    for call in (unread, read):
        Context(reduce_op="MAX").apply(call)
    assert (unread.reduce_op, read.reduce_op) == ("MAX", "SUM")


# --- on two gloo ranks: the runtime's own kernels, from a table naming an op torch lacks -------


@pytest.fixture(scope="module")
def ranks() -> Iterator[Ranks]:
    with Ranks(__file__, world=2) as r:
        yield r


def s_mismatch_with_a_newer_table(rank: int) -> dict[str, Any]:
    """The runtime re-registered from `TABLE`: a functional all_reduce (the namespace of the
    missing names) and a `torch.distributed` one still meet the check."""
    interceptor = installation._interceptor  # the installed runtime's, with its checker
    check, p2p = interceptor.check, interceptor.p2p
    assert check is not None and p2p is not None
    interceptor.uninstall()
    interceptor.ops = TABLE
    interceptor.install(check, p2p)
    try:
        errors = []
        for call in (
            lambda: funcol.all_reduce(torch.ones(4 if rank == 0 else 3), "sum", dist.group.WORLD),
            lambda: dist.all_reduce(torch.ones(8 >> rank)),
        ):
            try:
                call()
            except Exception as exc:
                errors.append(type(exc).__name__)
        x = torch.full((4,), float(rank + 1))
        funcol.all_reduce(x, "sum", dist.group.WORLD).wait()
        dist.all_reduce(x)
        return {"missing": interceptor.missing, "errors": errors, "x": x.tolist()}
    finally:
        interceptor.uninstall()
        interceptor.ops = OPS
        interceptor.install(check, p2p)


@pytest.mark.gloo
def test_a_table_naming_ops_torch_lacks_still_checks_the_rest(ranks: Ranks) -> None:
    for outcome in ranks.run(s_mismatch_with_a_newer_table):
        r = outcome.unwrap()
        assert tuple(r["missing"]) == tuple(n for n in TABLE if not dispatcher_has(n))
        assert r["errors"] == ["CollectiveMismatchError", "CollectiveMismatchError"]
        assert r["x"] == [3.0] * 4  # the functional all_reduce left x as it was


# --- distnb doctor's words --------------------------------------------------------------------


def test_doctor_says_what_a_table_naming_ops_torch_lacks_leaves_out() -> None:
    gaps = doctor.torch_gaps(TABLE)
    lacking = [name for name in TABLE if not dispatcher_has(name)]
    if lacking:
        assert f"not in this torch, so not intercepted: {', '.join(lacking)}" in gaps
    assert not any(NEWER in gap for gap in doctor.torch_gaps(OPS) if "not intercepted" in gap)


def test_doctor_names_an_op_whose_schema_it_cannot_read() -> None:
    gaps = doctor.torch_gaps({"c10d::allreduce_": lambda tensors: Call("all_reduce", "")})
    assert "a schema distnb cannot read, so not checked: c10d::allreduce_" in gaps
    assert any("collective ops distnb does not know" in g and "c10d::broadcast_" in g for g in gaps)


def _tested(tmp_path: Path) -> Path:
    """A tested.json as `.ci/compat` writes it: 2.9.1 passed everything, 2.14.1 failed one
    feature, 2.15.0 skipped the hosts."""

    def entry(release: str, build: str, **features: str) -> dict[str, object]:
        verdicts = {"checks": "passed", "debugger": "passed", "hosts": "passed", **features}
        return {"release": release, "build": build, "date": "2026-11-28 03:00 UTC",
                "commit": "abc1234", "features": verdicts}  # fmt: skip

    record = {
        "accepts": "torch>=2.8",
        "releases": [
            entry("2.9.1", "2.9.1+cu128"),
            entry("2.14.1", "2.14.1+cu130", debugger="failed"),
            entry("2.15.0", "2.15.0+cu130", hosts="skipped: rehearsal hosts need root"),
        ],
    }
    path = tmp_path / "tested.json"
    path.write_text(json.dumps(record))
    return path


@pytest.mark.parametrize(
    ("version", "words"),
    [
        (
            "2.9.1+cu128",
            "tested: checks, debugger, hosts passed on 2.9.1 (docs/compat.md, 2026-11-28",
        ),
        ("2.15.0", "tested: checks, debugger passed on 2.15.0"),
        ("2.14.1+cu130", "tested, and failed for debugger"),
        ("2.9.0", "not tested: the releases tested are 2.9.1, 2.14.1, 2.15.0"),
        ("2.12.1+cpu", "not tested: the releases tested are"),
        ("2.7.1", "older than distnb supports (torch>=2.8; tested: 2.9.1, 2.14.1, 2.15.0)"),
        ("2.8.0", "not tested: the releases tested are"),
        ("2.16.0.dev20270101", "not tested: newer than any release tested (2.9.1, 2.14.1"),
    ],
)
def test_doctor_says_whether_a_release_was_tested(tmp_path: Path, version: str, words: str) -> None:
    assert doctor.torch_range(version, _tested(tmp_path)).startswith(words)


def test_doctor_names_what_a_tested_release_did_not_run(tmp_path: Path) -> None:
    words = doctor.torch_range("2.15.0", _tested(tmp_path))
    assert words.endswith("; not run here: hosts")


def test_doctor_without_a_record_says_nothing_was_tested(tmp_path: Path) -> None:
    assert doctor.torch_range("2.13.0", tmp_path / "missing.json").startswith(
        "not tested: the releases tested are none"
    )


def test_the_shipped_record_is_the_compatibility_runs(tmp_path: Path) -> None:
    """tested.json is .ci/compat's, and docs/compat.md lists the same releases."""
    record = json.loads(doctor.TESTED.read_text())
    report = (Path(__file__).parents[2] / "docs" / "compat.md").read_text()
    assert record["releases"], "no release recorded: run .ci/compat"
    for entry in record["releases"]:
        assert f"| {entry['build']} | {entry['date']} | {entry['commit']} |" in report
