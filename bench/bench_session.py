"""Session benchmarks: start to ready, stop, and an empty cell's round trip.

    python bench/bench_session.py [--repeats 5] [--cells 200]
    python bench/bench_session.py --at-ranks 8 16 [--cells 100] [--name session-cells]

Each time is a median with its 95% interval (`median_ci`: order statistics; with few values
that is the minimum and maximum). Each ratio is the ratio of the two medians printed beside it
(`ratio_of_medians`), with a 95% interval from a paired bootstrap (a resampled pair keeps both
of its times):
- start: `distnb.start(2)` until every rank is in the process group, against plain ipyparallel
  (`Cluster(n=2).start_and_connect_sync()` with its defaults) + `import torch` on the engines
  + `init_process_group("gloo")`; each repeat starts both, one after the other with nothing
  else running, the order alternating (raw first in repeats 1, 3, ...; distnb first in 2, 4,
  ...), paired per repeat;
- stop: `session.stop()` until no process of the cluster runs, per repeat;
- cell: an empty `session.run("")` (what `%%allranks` does) against a raw
  `DirectView.execute("")` on the same cluster, both as `execute(block=True)` (returns at the
  reply) and waiting for the engines' output as well (what `%%px` and distnb must do to show it);
  in rounds of one cell of each kind, the order rotated round by round, paired per round, after
  warm-up rounds that are not counted (the output says how many);
- shapes: `session.shapes()` over a namespace of 1,000 tensors on each of the 2 ranks;
- desync: a cell in which rank 1 finishes while rank 0 waits at an all_reduce, until
  `CollectiveDesyncError`; the output says how many of the runs raised it (only those are
  timed: a run that does not raise measures something else);
- import: the CPU time (user + system) of a fresh Python process that imports torch, and of
  one that imports distnb, against one that imports nothing, in turns.

With `--at-ranks`, only the empty cell, on a session of each size given: `session.run("")`
against `%px`'s execute + wait for output on the same engines, and `%px` again as the control,
in rotated rounds as above; for each, the wall time and the kernel's CPU time (`process_time`
of this process, which plays the kernel: its main thread and ipyparallel's I/O thread) per cell.
The CPU is what the kernel costs a cell when every rank has a core of its own; its excess over
`%px`'s is distnb's own work.

Every ratio has a control row: the peer against itself, measured the same way in the same run
(a second raw start in each repeat, a second raw cell in each round, the shared-memory release
twice in each turn), whose ratio is the noise floor of the row above it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import psutil

import distnb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from median_ci import median_ci, ratio_of_medians  # bench/ is on the path, as above
from results import saved

WARMUP_ROUNDS = 10


def raw_start(n: int = 2) -> tuple[float, Any]:
    import ipyparallel as ipp

    started = time.perf_counter()
    cluster = ipp.Cluster(n=n, profile_dir=tempfile.mkdtemp(prefix="bench-ipp-"), log_level=40)
    client = cluster.start_and_connect_sync()
    view = client[:]
    view.execute("import torch, torch.distributed as dist", block=True)
    port = _free_port()
    view.scatter("rank", list(range(n)), flatten=True, block=True)
    view.execute(
        f"dist.init_process_group('gloo', init_method='tcp://127.0.0.1:{port}', "
        f"rank=rank, world_size={n})",
        block=True,
    )
    return time.perf_counter() - started, cluster


def raw_start_stopped(n: int = 2) -> float:
    """raw_start's time, its cluster stopped before anything else starts."""
    elapsed, cluster = raw_start(n)
    cluster.stop_cluster_sync()
    return elapsed


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def distnb_start(n: int = 2) -> tuple[float, distnb.Session]:
    started = time.perf_counter()
    session = distnb.start(n, progress=False)
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
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _px(view: Any) -> Callable[[], None]:
    """`%px`'s empty cell: execute, and wait for its output."""

    def px() -> None:
        ar = view.execute("", block=False)
        ar.get()
        ar.wait_for_output()

    return px


def cell_costs(
    session: distnb.Session, rounds: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """The wall time and the kernel's CPU time (this process's `process_time`) of each kind of
    empty cell in each round (s): distnb's, raw ipyparallel's (`raw`, `raw again`: the control),
    `%px`'s (execute + wait for output) and `%px`'s again (the control). A round runs one cell
    of each kind, the order rotated round by round, so drift on a busy machine hits all kinds
    alike and each kind's time pairs with the others' from the same round; uncounted warm-up
    rounds first."""
    view = session.cluster.client[[r.engine_id for r in session.ranks]]  # type: ignore[union-attr]
    kinds: dict[str, Callable[[], Any]] = {
        "distnb": lambda: session.run(""),
        "raw": lambda: view.execute("", block=True),
        "raw again": lambda: view.execute("", block=True),
        "px": _px(view),
        "px again": _px(view),
    }
    names = list(kinds)
    wall: dict[str, list[float]] = {k: [] for k in kinds}
    cpu: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(-WARMUP_ROUNDS, rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            t, c = time.perf_counter(), time.process_time()
            kinds[name]()
            t, c = time.perf_counter() - t, time.process_time() - c
            if r >= 0:
                wall[name].append(t)
                cpu[name].append(c)
    return wall, cpu


def at_ranks(worlds: list[int], rounds: int) -> None:
    """`--at-ranks`: an empty cell's wall time and kernel CPU against `%px`'s, per session size."""
    print(
        f"# empty cell: {rounds} rounds of one cell of each kind (order rotated), paired per"
        f" round; {WARMUP_ROUNDS} warm-up rounds not counted"
    )
    print(
        "# times: median [95% interval of the median, order statistics];"
        " ratio: distnb's median / %px's [95% interval, paired bootstrap]"
    )
    print(f"{'measure':42} {'distnb':>26} {'peer':>26} {'ratio':>20}  peer")
    for world in worlds:
        session = distnb.start(world, progress=False)
        try:
            wall, cpu = cell_costs(session, rounds)
        finally:
            session.stop()
        px = "%px: execute + wait for output"
        rows = [
            _row(f"{world} ranks: empty cell, wall (ms)", wall["distnb"], wall["px"], 1e3, px),
            _row("  control: %px again, wall (ms)", wall["px again"], wall["px"], 1e3, px),
            _row(f"{world} ranks: empty cell, kernel CPU (ms)", cpu["distnb"], cpu["px"], 1e3, px),
            _row("  control: %px again, kernel CPU (ms)", cpu["px again"], cpu["px"], 1e3, px),
        ]
        extra = statistics.median(cpu["distnb"]) - statistics.median(cpu["px"])
        rows.append(f"  kernel CPU beyond %px's, {world} ranks: {extra * 1e3:.2f} ms a cell")
        print("\n".join(rows), flush=True)


def shapes_times(session: distnb.Session, repeats: int = 7) -> list[float]:
    session.run("g = globals()\nfor i in range(1000):\n    g[f't{i}'] = torch.zeros(8, i % 7 + 1)")
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        view = session.shapes()
        times.append(time.perf_counter() - t)
    assert len(view.table.rows) >= 1000
    return times


def desync_release_times(session: distnb.Session, repeats: int = 7) -> tuple[list[float], int]:
    """A cell in which rank 1 finishes at once while rank 0 waits at an all_reduce: the whole
    cell's time is the time to release rank 0 (plus one empty cell's round trip). Returns the
    times of the runs that raised CollectiveDesyncError, and how many runs there were, so the
    output can say how many did not raise (their time measures something else)."""
    from distnb.errors import CollectiveDesyncError

    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        try:
            session.run("x = torch.ones(1)\nif rank == 0:\n    dist.all_reduce(x)", timeout=30)
        except CollectiveDesyncError:
            times.append(time.perf_counter() - t)
    if not times:
        raise RuntimeError(f"desync: none of {repeats} runs raised CollectiveDesyncError")
    return times, repeats


def store_path_release_times(repeats: int = 9) -> tuple[list[float], list[float], list[float]]:
    """The desync release through the store (ranks as if on different hosts, DISTNB_SHM=0)
    and through shared memory, each on a session of its own, taking turns run by run."""
    import os

    from distnb.rank.checked.checker import SHM_VAR

    os.environ[SHM_VAR] = "0"
    try:
        store = distnb.start(2, progress=False)
    finally:
        del os.environ[SHM_VAR]
    shm = distnb.start(2, progress=False)
    through: dict[str, list[float]] = {"store": [], "shm": [], "shm again": []}
    try:
        for i in range(repeats):
            turns = [("store", store), ("shm", shm), ("shm again", shm)]
            k = i % len(turns)
            for name, session in turns[k:] + turns[:k]:
                times, _ = desync_release_times(session, repeats=1)
                through[name] += times
    finally:
        store.stop()
        shm.stop()
    return through["store"], through["shm"], through["shm again"]


def import_cpu(repeats: int = 7) -> dict[str, list[float]]:
    """CPU seconds (user + system) of a fresh Python that imports `torch`, `distnb`, or nothing,
    in turns; each from its children's rusage, so the parent's own work is not counted."""
    import resource
    import subprocess

    codes = {"torch": "import torch", "distnb": "import distnb", "nothing": "pass"}
    cpu: dict[str, list[float]] = {k: [] for k in codes}
    for i in range(repeats):
        names = list(codes)
        k = i % len(names)
        for name in names[k:] + names[:k]:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([sys.executable, "-c", codes[name]], check=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            used = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
            cpu[name].append(used)
    return cpu


def _time(values: list[float], scale: float) -> str:
    """median [95% interval], scaled."""
    low, high = median_ci(values)
    return f"{statistics.median(values) * scale:8.3f} [{low * scale:.3f}-{high * scale:.3f}]"


def _row(name: str, ours: list[float], peer: list[float] | None, scale: float, label: str) -> str:
    """A measure's line: distnb's time, the peer's and the ratio of their medians, if any."""
    if peer is None:
        return f"{name:42} {_time(ours, scale):>26} {'':>26} {'':>20}  {label}".rstrip()
    ratio, low, high = ratio_of_medians(ours, peer)
    ratio_text = f"{ratio:6.2f}x [{low:.2f}-{high:.2f}]"
    return f"{name:42} {_time(ours, scale):>26} {_time(peer, scale):>26} {ratio_text:>20}  {label}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cells", type=int, default=200, help="rounds of one cell of each kind")
    parser.add_argument(
        "--at-ranks", type=int, nargs="+", default=[], help="only the empty cell, at these sizes"
    )
    parser.add_argument("--name", default="", help="bench/results/<name>.txt")
    args = parser.parse_args()
    if args.at_ranks:
        with saved(args.name or "session-cells"):
            at_ranks(args.at_ranks, args.cells)
        return
    with saved(args.name or "session"):
        run(args)


def run(args: argparse.Namespace) -> None:
    starts, raws, raws_again, stops = [], [], [], []
    for i in range(args.repeats):
        distnb_first = i % 2 == 1  # alternate, so neither start always goes first
        if not distnb_first:
            raws.append(raw_start_stopped())
        t_ours, session = distnb_start()
        starts.append(t_ours)
        if i == 0:
            cells, _ = cell_costs(session, args.cells)
            shapes = shapes_times(session)
            release, runs = desync_release_times(session)
        stops.append(stop_time(session))
        if distnb_first:
            raws.append(raw_start_stopped())
        raws_again.append(raw_start_stopped())  # the control: the peer's start once more
    store_release, shm_release, shm_again = store_path_release_times()
    cpu = import_cpu()
    print(
        f"# start: {args.repeats} repeats, the order alternating (raw first in repeats 1, 3, ...;"
        " distnb first in 2, 4, ...), paired per repeat"
    )
    print(
        f"# cell: {args.cells} rounds of one cell of each kind (order rotated), paired per round;"
        f" {WARMUP_ROUNDS} warm-up rounds before them not counted"
    )
    print(
        "# times: median [95% interval of the median, order statistics: with few values, min-max];"
        "\n# ratio: distnb's median / the peer's median [95% interval, paired bootstrap]"
    )
    print(f"{'measure':42} {'distnb':>26} {'peer':>26} {'ratio':>20}  peer")
    rows = [
        _row("start to ready, 2 ranks (s)", starts, raws, 1, "raw ipyparallel+torch+init"),
        _row("  control: raw start again (s)", raws_again, raws, 1, "raw ipyparallel+torch+init"),
        _row("stop, every process gone (s)", stops, None, 1, ""),
        _row(
            "empty cell round trip (ms)",
            cells["distnb"],
            cells["raw"],
            1e3,
            "raw DirectView.execute(block=True)",
        ),
        _row(
            "empty cell round trip (ms)",
            cells["distnb"],
            cells["px"],
            1e3,
            "raw execute + wait for output",
        ),
        _row(
            "  control: raw cell again (ms)",
            cells["raw again"],
            cells["raw"],
            1e3,
            "raw DirectView.execute(block=True)",
        ),
        _row("shape table, 1,000 tensors x 2 ranks (s)", shapes, None, 1, ""),
        _row(
            "desync: rank done -> waiter released (s)",
            release,
            None,
            1,
            f"{len(release)} of {runs} runs raised CollectiveDesyncError (only those timed)",
        ),
        _row(
            "desync release, store path (s)",
            store_release,
            shm_release,
            1,
            "the same through shared memory (DISTNB_SHM=0 against 1, turns)",
        ),
        _row(
            "  control: shared memory again (s)",
            shm_again,
            shm_release,
            1,
            "the same through shared memory",
        ),
        _row(
            "import torch, CPU of a process (s)", cpu["torch"], cpu["nothing"], 1, "python -c pass"
        ),
        _row(
            "import distnb, CPU of a process (s)",
            cpu["distnb"],
            cpu["nothing"],
            1,
            "python -c pass",
        ),
    ]
    print("\n".join(rows))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
