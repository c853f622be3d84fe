"""The pure comparison behind replica checks: groups that agree, names missing, shards alone."""

from __future__ import annotations

from distnb.records.replicas import Digest, ReplicaReport, compare

W = (0, 1, 2, 3)


def d(name: str, rank: int, bits: str, group: tuple[int, ...] = W, value: str = "") -> Digest:
    return Digest(name, rank, group, bits, (2,), "float32", 8, value)


def test_ranks_are_grouped_by_what_they_hold_largest_group_first() -> None:
    digests = [d("w", 0, "a"), d("w", 1, "b"), d("w", 2, "a"), d("w", 3, "b"), d("v", 0, "x")]
    digests += [d("v", r, "x") for r in (1, 2, 3)]
    differences, missing, compared, alone = compare(digests, W)
    assert [(x.name, x.agree) for x in differences] == [("w", ((0, 2), (1, 3)))]
    assert (missing, compared, alone) == ([], 2, 0)


def test_only_replica_groups_are_compared_and_shards_are_alone() -> None:
    # two data-parallel groups (0,1) and (2,3) holding different tensor-parallel shards
    digests = [d("tp", r, "a" if r < 2 else "b", (0, 1) if r < 2 else (2, 3)) for r in W]
    digests += [d("shard", r, str(r), (r,)) for r in W]
    differences, _, compared, alone = compare(digests, W)
    assert differences == [] and compared == 2 and alone == 1


def test_missing_names_values_and_expected_differences() -> None:
    digests = [d("lr", r, "", value="0.1" if r else "0.2") for r in (0, 1)] + [d("extra", 0, "a")]
    differences, missing, _, _ = compare(digests, (0, 1))
    assert differences[0].values == ("0.2", "0.1") and missing == [("extra", (1,))]
    same = [d("batch", r, "a" if r < 3 else "b") for r in W]
    (found,), _, _, _ = compare(same, W, expect="differ")
    assert found.expected == "differ" and found.agree == ((0, 1, 2), (3,))
    report = ReplicaReport(("batch",), W, 1, 32)
    assert ReplicaReport.from_dict(report.to_dict()) == report and report.agree


def test_one_rank_has_no_replica_and_says_so_not_sharded() -> None:
    from distnb.views.replicas import ReplicaView

    one = compare([d("w", 0, "a", (0,))], (0,))
    assert one == ([], [], 0, 1)
    view = ReplicaView(ReplicaReport(("w",), (0,), 0, 8, alone=1))
    only = "nothing to compare on rank 0: one rank holds the only copy of each tensor"
    assert view.summary() == only
    sharded = ReplicaView(ReplicaReport(("w",), (0, 1), 0, 16, alone=1))
    assert "every tensor is sharded" in sharded.summary()
