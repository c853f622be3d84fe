"""Benchmark the views: timeline renderings of 10,000 events, shape scans of 1,000 tensors.

Run:  .venv/bin/python bench/bench_views.py [--repeat 7] [--scale]

`--scale`: only the views of 32 ranks on 4 hosts (status, a 200-name shape table, a 10,000-event
timeline, the same with its lanes grouped by host, a mismatch, a hang report, a 200-name replica
diff), saved apart (bench/results/views-scale.txt).

Targets: each timeline rendering <= 1 s (measured from the events: building the timeline is
included, as it is when a view is displayed); scan of a 1,000-tensor namespace on each of 2
ranks (in-process) + table build <= 0.5 s. Prints medians; PNG also cold (first call, which
imports matplotlib).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from distnb.records.collective import CallSite, CollectiveEvent

OPS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast")


def synthetic_events(n_ranks: int, n_events: int, seed: int = 0) -> list[CollectiveEvent]:
    """`n_events` events: collectives on every rank, rank 1 late by ~50 µs, two groups."""
    rnd = random.Random(seed)
    out: list[CollectiveEvent] = []
    t = 1_000_000
    seqs = {"WORLD": 0, "tp": 0}
    for i in range(n_events // n_ranks):
        group = "tp" if i % 5 == 4 else "WORLD"
        seq = seqs[group]
        seqs[group] += 1
        op = OPS[i % len(OPS)]
        site = CallSite("/tmp/ipykernel_1/12.py", 3 + i % 7, cell=12, code=f"dist.{op}(x)")
        arrive = {r: t + rnd.randint(0, 3_000) + (50_000 if r == 1 else 0) for r in range(n_ranks)}
        start = max(arrive.values()) + 4_000
        end = start + 20_000 + rnd.randint(0, 5_000)
        out += [
            CollectiveEvent(r, group, seq, op, 4 << 20, site, arrive[r], start, end, 12, n_ranks)
            for r in range(n_ranks)
        ]
        t = end + 10_000
    return out


def median_s(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_timeline(repeat: int, tmp: Path) -> list[tuple[str, float, float | None]]:
    from distnb.views.timeline import TimelineView

    rows: list[tuple[str, float, float | None]] = []
    events2 = synthetic_events(2, 10_000)
    start = time.perf_counter()
    TimelineView(events2).savefig(tmp / "cold.png")
    cold = time.perf_counter() - start
    rows.append(("10,000 events, 2 ranks: PNG, first call (imports matplotlib)", cold, None))
    for n_ranks in (2, 8):
        label = f"10,000 events, {n_ranks} ranks"
        for name, fn in timeline_cases(synthetic_events(n_ranks, 10_000), tmp):
            rows.append((f"{label}: {name}", median_s(fn, repeat), 1.0))
    return rows


def timeline_cases(
    events: list[CollectiveEvent], tmp: Path
) -> list[tuple[str, Callable[[], object]]]:
    """Each case starts from the events, as displaying a fresh view does."""
    from distnb.views.timeline import TimelineView
    from distnb.views.timeline.model import build_timeline

    return [
        ("build_timeline only", lambda: build_timeline(events)),
        ("text (__repr__)", lambda: repr(TimelineView(events))),
        ("HTML (_repr_html_, SVG)", lambda: TimelineView(events)._repr_html_()),
        ("PNG (savefig)", lambda: TimelineView(events).savefig(tmp / "t.png")),
        ("Chrome trace", lambda: TimelineView(events).export_chrome_trace(tmp / "t.json")),
    ]


def bench_shapes(repeat: int) -> list[tuple[str, float, float | None]]:
    import torch
    from torch import nn

    from distnb.rank.scan import scan_namespace
    from distnb.views.shape_table import build_table
    from distnb.views.shapes import ShapeTableView

    def namespace(rank: int) -> dict[str, object]:
        ns: dict[str, object] = {f"t{i}": torch.randn(64, 64) for i in range(1000)}
        ns["t7"] = torch.randn(64, 64 + rank)  # one rank-dependent shape
        ns["t9"] = torch.full((4,), math.nan)
        return ns

    ranks = [namespace(0), namespace(1)]

    def scan_and_build() -> object:
        return build_table([scan_namespace(ns, rank=r) for r, ns in enumerate(ranks)])

    table = build_table([scan_namespace(ns, rank=r) for r, ns in enumerate(ranks)])
    model = {"model": nn.Sequential(*[nn.Linear(32, 32) for _ in range(2000)])}
    return [
        (
            "1,000 tensors: scan one rank",
            median_s(lambda: scan_namespace(ranks[0], rank=0), repeat),
            0.5,
        ),
        ("1,000 tensors: scan 2 ranks + build_table", median_s(scan_and_build, repeat), 0.5),
        ("1,000 rows, 2 ranks: text", median_s(lambda: repr(ShapeTableView(table)), repeat), 1.0),
        (
            "1,000 rows, 2 ranks: HTML",
            median_s(lambda: ShapeTableView(table)._repr_html_(), repeat),
            1.0,
        ),
        (
            "module, 4,000 params: scan",
            median_s(lambda: scan_namespace(model, rank=0), repeat),
            0.5,
        ),
    ]


def bench_scale(repeat: int) -> list[tuple[str, float, float | None]]:
    """32 ranks on 4 hosts: the status table, a 200-name shape table (rank 17 differs in one
    name), a 10,000-event timeline; each from its records, as displaying a fresh view does."""
    from distnb.records.cell import RankInfo
    from distnb.records.resources import RankResources
    from distnb.records.shapes import ShapeScan, TensorMeta
    from distnb.views.shape_table import build_table
    from distnb.views.shapes import ShapeTableView
    from distnb.views.status import Status
    from distnb.views.timeline import TimelineView

    infos = tuple(
        RankInfo(r, r % 8, r, f"node{r // 8}", 1000 + r, "cpu", "gloo", f"10.0.0.{r // 8}")
        for r in range(32)
    )
    res = tuple(RankResources(r, (400 + r) << 20, 600 << 20, 4) for r in range(32))
    status = Status(infos, resources=res, states=("alive",) * 32)

    def scan(r: int) -> ShapeScan:
        entries = tuple(
            TensorMeta(f"t{i}", (64, 65 if (r, i) == (17, 7) else 64), "float32", "cpu")
            for i in range(200)
        )
        return ShapeScan(r, entries)

    scans = [scan(r) for r in range(32)]
    events = synthetic_events(32, 10_000)
    table = build_table(scans)
    return [
        ("32 ranks, 4 hosts: status text", median_s(lambda: repr(status), repeat), 1.0),
        ("32 ranks, 4 hosts: status HTML", median_s(status._repr_html_, repeat), 1.0),
        ("200 names x 32 ranks: build_table", median_s(lambda: build_table(scans), repeat), 1.0),
        ("200 names x 32 ranks: text", median_s(lambda: repr(ShapeTableView(table)), repeat), 1.0),
        (
            "200 names x 32 ranks: HTML",
            median_s(lambda: ShapeTableView(table)._repr_html_(), repeat),
            1.0,
        ),
        (
            "10,000 events, 32 ranks: text",
            median_s(lambda: repr(TimelineView(events)), repeat),
            1.0,
        ),
        (
            "10,000 events, 32 ranks: HTML (SVG)",
            median_s(lambda: TimelineView(events)._repr_html_(), repeat),
            1.0,
        ),
        *bench_scale_grouped(repeat, events),
    ]


def bench_scale_grouped(
    repeat: int, events: list[CollectiveEvent]
) -> list[tuple[str, float, float | None]]:
    """What groups ranks at 32: the timeline on 4 hosts (lanes per host, rank 1 late alone), a
    mismatch of one rank, a hang report with one rank asleep, a replica diff of 200 names where
    rank 31 differs in 3; each from its records."""
    from distnb.errors import RankTimeoutError
    from distnb.judgement import match
    from distnb.records.cell import RankReport, RankState
    from distnb.records.collective import Fingerprint, TensorSpec
    from distnb.records.replicas import Digest, ReplicaReport, compare
    from distnb.views.mismatch import MismatchView
    from distnb.views.replicas import ReplicaView
    from distnb.views.timeline import TimelineView

    hosts = {r: f"node{r // 8}" for r in range(32)}
    site = CallSite("train.py", 41, code="dist.all_reduce(x)")
    fps = [
        Fingerprint(r, "WORLD", 3, "all_reduce", (TensorSpec((4 if r == 16 else 8,), "float32"),),
                    reduce_op="SUM", site=site, group_ranks=tuple(range(32)))
        for r in range(32)
    ]  # fmt: skip
    found = match(fps)
    assert found is not None
    reports = [
        RankReport(r, RankState.RUNNING, "still running", "  train.py line 40: load()")
        if r == 16
        else RankReport(r, RankState.RUNNING, "waiting at all_reduce #3 for rank 16", str(site))
        for r in range(32)
    ]
    hang = RankTimeoutError("train.py still running", reports)
    ranks = tuple(range(32))
    digests = [
        Digest(f"p{i}", r, ranks, "b" if r == 31 and i < 3 else "a", (64,), "float32", 256)
        for r in ranks
        for i in range(200)
    ]
    diffs, missing, compared, alone = compare(digests, ranks)
    replicas = ReplicaReport(("model",), ranks, compared, 0, tuple(diffs), tuple(missing), alone)
    on_hosts = "10,000 events, 32 ranks, lanes by host"
    return [
        (
            f"{on_hosts}: text",
            median_s(lambda: repr(TimelineView(events, hosts=hosts)), repeat),
            1.0,
        ),
        (
            f"{on_hosts}: HTML (SVG)",
            median_s(lambda: TimelineView(events, hosts=hosts)._repr_html_(), repeat),
            1.0,
        ),
        ("32 ranks: mismatch (match + message)", median_s(lambda: match(fps), repeat), 1.0),
        ("32 ranks: mismatch HTML", median_s(MismatchView(found)._repr_html_, repeat), 1.0),
        ("32 ranks: hang report text", median_s(hang._render_traceback_, repeat), 1.0),
        (
            "200 names x 32 ranks: replica compare",
            median_s(lambda: compare(digests, ranks), repeat),
            1.0,
        ),
        (
            "200 names x 32 ranks: replica diff text",
            median_s(lambda: str(ReplicaView(replicas)), repeat),
            1.0,
        ),
        (
            "200 names x 32 ranks: replica diff HTML",
            median_s(ReplicaView(replicas)._repr_html_, repeat),
            1.0,
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--scale", action="store_true", help="only the 32-rank views")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.scale:
            rows = bench_scale(args.repeat)
        else:
            rows = bench_timeline(args.repeat, Path(tmp)) + bench_shapes(args.repeat)
    width = max(len(name) for name, _, _ in rows)
    print(f"{'case':<{width}}  median    target")
    failed = 0
    for name, seconds, target in rows:
        if target is None:
            print(f"{name:<{width}}  {seconds * 1e3:7.1f} ms  (once per kernel; no target)")
            continue
        ok = seconds <= target
        failed += not ok
        print(f"{name:<{width}}  {seconds * 1e3:7.1f} ms  <= {target:g} s {'ok' if ok else 'OVER'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from results import saved

    with saved("views-scale" if "--scale" in sys.argv else "views"):
        main()
