"""Session benchmarks: start to ready, stop, and an empty cell's round trip.

    python bench/bench_session.py [--repeats 5] [--cells 200]

Each figure is a median, printed beside its peer measured in the same run:
- start: `distnb.start(2)` until every rank is in the process group, against plain ipyparallel
  (`Cluster(n=2).start_and_connect_sync()` with its defaults) + `import torch` on the engines
  + `init_process_group("gloo")`;
- stop: `session.stop()` until no process of the cluster runs;
- cell: an empty `session.run("")` (what `%%allranks` does) against a raw
  `DirectView.execute("")` on the same cluster, both as `execute(block=True)` (returns at the
  reply) and waiting for the engines' output as well (what `%%px` and distnb must do to show it);
- shapes: `session.shapes()` over a namespace of 1,000 tensors on each of the 2 ranks.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

import psutil

import distnb


def raw_start() -> tuple[float, Any]:
    import ipyparallel as ipp

    started = time.perf_counter()
    cluster = ipp.Cluster(n=2, profile_dir=tempfile.mkdtemp(prefix="bench-ipp-"), log_level=40)
    client = cluster.start_and_connect_sync()
    view = client[:]
    view.execute("import torch, torch.distributed as dist", block=True)
    port = _free_port()
    view.scatter("rank", [0, 1], flatten=True, block=True)
    view.execute(
        f"dist.init_process_group('gloo', init_method='tcp://127.0.0.1:{port}', "
        "rank=rank, world_size=2)",
        block=True,
    )
    return time.perf_counter() - started, cluster


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def distnb_start() -> tuple[float, distnb.Session]:
    started = time.perf_counter()
    session = distnb.start(2, progress=False)
    return time.perf_counter() - started, session


def stop_time(session: distnb.Session) -> float:
    pids = session.pids()
    started = time.perf_counter()
    session.stop()
    while any(_runs(pid) for pid in pids):
        time.sleep(0.001)
    return time.perf_counter() - started


def _runs(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def cell_times(session: distnb.Session, cells: int) -> tuple[list[float], ...]:
    view = session._cluster.client[[r.engine_id for r in session.ranks]]  # type: ignore[union-attr]

    def raw_with_output() -> None:
        ar = view.execute("", block=False)
        ar.get()
        ar.wait_for_output()

    ours: list[float] = []
    raw: list[float] = []
    raw_out: list[float] = []
    for _ in range(10):  # warm-up
        session.run("")
        view.execute("", block=True)
    for _ in range(cells):  # interleaved, so drift on a busy machine hits all alike
        for fn, times in (
            (lambda: session.run(""), ours),
            (lambda: view.execute("", block=True), raw),
            (raw_with_output, raw_out),
        ):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return ours, raw, raw_out


def shapes_time(session: distnb.Session, repeats: int = 7) -> float:
    session.run("g = globals()\nfor i in range(1000):\n    g[f't{i}'] = torch.zeros(8, i % 7 + 1)")
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        view = session.shapes()
        times.append(time.perf_counter() - t)
    assert len(view.table.rows) >= 1000
    return statistics.median(times)


def desync_release_time(session: distnb.Session, repeats: int = 7) -> float:
    """A cell in which rank 1 finishes at once while rank 0 waits at an all_reduce: the whole
    cell's time is the time to release rank 0 (plus one empty cell's round trip)."""
    from distnb.errors import CollectiveDesyncError

    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        try:
            session.run("x = torch.ones(1)\nif rank == 0:\n    dist.all_reduce(x)", timeout=30)
        except CollectiveDesyncError:
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cells", type=int, default=200)
    args = parser.parse_args()
    print(f"$ python bench/bench_session.py --repeats {args.repeats} --cells {args.cells}")
    print(f"# {platform.node()}: {psutil.cpu_count()} cores, Python {platform.python_version()}")
    starts, raws, stops = [], [], []
    for i in range(args.repeats):
        t_raw, cluster = raw_start()
        cluster.stop_cluster_sync()
        t_ours, session = distnb_start()
        raws.append(t_raw)
        starts.append(t_ours)
        if i == 0:
            ours_cells, raw_cells, raw_out_cells = cell_times(session, args.cells)
            shapes = shapes_time(session)
            release = desync_release_time(session)
        stops.append(stop_time(session))
    med = statistics.median
    rows = [
        ("start to ready, 2 ranks (s)", med(starts), med(raws), "raw ipyparallel+torch+init"),
        ("stop, every process gone (s)", med(stops), None, ""),
        (
            "empty cell round trip (ms)",
            med(ours_cells) * 1e3,
            med(raw_cells) * 1e3,
            "raw DirectView.execute(block=True)",
        ),
        (
            "empty cell round trip (ms)",
            med(ours_cells) * 1e3,
            med(raw_out_cells) * 1e3,
            "raw execute + wait for output",
        ),
        ("shape table, 1,000 tensors x 2 ranks (s)", shapes, None, ""),
        ("desync: rank done -> waiter released (s)", release, None, ""),
    ]
    print(f"{'measure':42} {'distnb':>9} {'peer':>9} {'ratio':>7}  peer")
    for name, ours, peer, label in rows:
        ratio = f"{ours / peer:6.2f}x" if peer else ""
        peer_text = f"{peer:9.3f}" if peer else " " * 9
        print(f"{name:42} {ours:9.3f} {peer_text} {ratio:>7}  {label}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
