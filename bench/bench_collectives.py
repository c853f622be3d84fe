"""What checking collectives costs: distnb's checked runtime against its peers, on gloo.

    python bench/bench_collectives.py [--quick] [--ranks 2 4]
    python bench/bench_collectives.py --focus all_reduce:4MiB broadcast:8el [--rounds 60]

For each world size it starts the ranks once (spawned processes, a TCPStore in this process as
the control plane, gloo on loopback) and times, interleaved round by round so that a busy machine
slows every mode alike:

- plain:       torch.distributed as is (`distnb.unchecked()` around the call);
- again:       plain once more, in its own turn: the control, whose ratio to plain shows how far
               two runs of the same code differ here (the noise floor of every other ratio);
- barrier:     (`--focus` only) plain after an exchange of a fixed payload through a
               shared-memory board, as the checker makes: what any check made before data
               moves pays for the round trip alone;
- checked:     distnb's checked runtime (`torch.distributed`'s calls checked at the group's
               methods, every other caller at the ops' kernels; fingerprints through shared
               memory);
- DETAIL:      `TORCH_DISTRIBUTED_DEBUG=DETAIL` (a process group created at debug level DETAIL,
               which wraps gloo in torch's ProcessGroupWrapper);
- accel:       Accelerate's `gather` / `broadcast` / `reduce` (`PartialState(cpu=True)`);
- accel-debug: the same with `ACCELERATE_DEBUG_MODE=1` (its shape check through
               `gather_object`); without `cpu=True` it silently disables itself on CPU.

all_reduce, all_gather and broadcast at 8 elements, 64 KiB, 4 MiB and 64 MiB of float32; the
median per iteration of the slowest rank. A machine this small drifts by a factor of two within a
minute (plain 4 MiB broadcasts took 1.7 ms in one run and 3.2 ms in the next), so the modes take
turns in short rounds, each mode in every place of the order in turn, and each ratio is the
median over rounds of that round's median against plain's in the same round. Then: the time
from the last rank's arrival to the mismatch error on every rank, how fast the kernel's abort key
releases a waiting rank, and the CPU cost of a check with nobody to wait for.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from median_ci import median_ci  # noqa: E402
from spawned import Spawned  # noqa: E402

from distnb import keys  # noqa: E402  (after the path: the bench runs from a checkout)

MODES = ("plain", "again", "checked", "DETAIL", "accel", "accel-debug")
# ranks, op, size, median ms per mode, ratio to plain per mode (median of per-round ratios),
# each ratio's 95% confidence interval (`median_ci`)
Row = tuple[int, str, str, dict[str, float], dict[str, float], dict[str, tuple[float, float]]]
OPS = ("all_reduce", "all_gather", "broadcast")
SIZES = {"8 el": 8, "64 KiB": 16 * 1024, "4 MiB": 1024 * 1024, "64 MiB": 16 * 1024 * 1024}
# (iterations per round, rounds) per size, full and --quick
PLAN = {"8 el": (60, 20), "64 KiB": (20, 20), "4 MiB": (4, 30), "64 MiB": (1, 12)}
QUICK = {"8 el": (40, 4), "64 KiB": (15, 4), "4 MiB": (3, 4)}


# --- ranks --------------------------------------------------------------------------------------


def _worker(rank: int, world: int, port: int, conn: Connection) -> None:
    warnings.simplefilter("ignore")
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port + 1),
        OMP_NUM_THREADS="1",
        ACCELERATE_DEBUG_MODE="1",
    )
    import torch
    import torch.distributed as dist

    from distnb.rank import checked

    torch.set_num_threads(1)
    client = dist.TCPStore("127.0.0.1", port, None, False, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group(
        "gloo", store=dist.PrefixStore("pg", client), rank=rank, world_size=world
    )
    checked.install(
        dist.PrefixStore("check", client), rank=rank, world_size=world, session_id=f"bench{port}"
    )
    dist.set_debug_level(dist.DebugLevel.DETAIL)
    detail = dist.new_group(list(range(world)))
    dist.set_debug_level(dist.DebugLevel.OFF)
    from accelerate import PartialState  # type: ignore[import-untyped]
    from accelerate.utils import operations as acc  # type: ignore[import-untyped]

    state = PartialState(cpu=True)
    torch.set_num_threads(1)
    rig = _Rig(rank, world, detail, state, acc)
    conn.send("ready")
    while True:
        request = conn.recv()
        if request is None:
            break
        name, kwargs = request
        conn.send(getattr(rig, name)(**kwargs))
    checked.uninstall()
    dist.destroy_process_group()


class _Rig:
    """What a rank can be asked to time."""

    def __init__(self, rank: int, world: int, detail: Any, state: Any, acc: Any) -> None:
        self.rank, self.world, self.detail, self.state, self.acc = rank, world, detail, state, acc
        self._board: Any = None  # the "barrier" mode's board, and its last stamp
        self._stamp = 0

    def time_op(self, op: str, numel: int, mode: str, iters: int, gap_ms: float = 0) -> list[int]:
        import torch
        import torch.distributed as dist

        from distnb.rank import checked

        x = torch.ones(numel)
        outs = [torch.empty(numel) for _ in range(self.world)]
        group = self.detail if mode == "DETAIL" else None
        acc = self.acc
        self.state.debug = mode == "accel-debug"
        calls: dict[str, Callable[[], Any]] = {
            "all_reduce": lambda: dist.all_reduce(x, group=group),
            "all_gather": lambda: dist.all_gather(outs, x, group=group),
            "broadcast": lambda: dist.broadcast(x, src=0, group=group),
        }
        if mode.startswith("accel"):
            calls = {
                "all_reduce": lambda: acc.reduce(x, reduction="sum"),
                "all_gather": lambda: acc.gather(x),
                "broadcast": lambda: acc.broadcast(x, from_process=0),
            }
        call = calls[op]
        if mode == "barrier":
            call = self._after_barrier(call)
        times = []
        with checked.unchecked() if mode != "checked" else _nothing():
            call()  # warm up this mode
            dist.barrier()
            for _ in range(iters):
                if gap_ms:
                    time.sleep(gap_ms / 1000)  # other work between collectives, as in a step
                t0 = time.perf_counter_ns()
                call()
                times.append(time.perf_counter_ns() - t0)
        return times

    def _after_barrier(self, call: Callable[[], Any]) -> Callable[[], Any]:
        """`call` after an exchange of a fixed payload through a board like the checker's: the
        round trip any check made before data moves must pay, without the check itself."""
        from distnb.rank import checked
        from distnb.rank.checked import exchange

        if self._board is None:
            checker = checked._checker
            assert checker is not None
            path = exchange.shm_path(checker.session_id, f"bench-barrier-{self.world}")
            self._board = exchange.ShmBoard(path, self.world, 2, 64)
        board, me = self._board, self.rank
        peers = [r for r in range(self.world) if r != me]

        def barrier_then_call() -> Any:
            self._stamp += 1
            board.post(me, self._stamp, b"F")
            exchange.collect(board, peers, self._stamp, lambda *_: None)
            if self._stamp == 1:
                board.forget()  # every rank has it mapped: its file can go
            return call()

        return barrier_then_call

    def mismatch_latency(self, trials: int) -> list[tuple[int, int]]:
        """(arrival of the last rank, this rank's raise) per trial, monotonic ns."""
        import torch
        import torch.distributed as dist

        from distnb.errors import CollectiveMismatchError

        out = []
        for _ in range(trials):
            dist.barrier()
            last = self.rank == self.world - 1
            if last:
                time.sleep(0.02)  # arrive last, while the others wait
            x = torch.zeros(8 if not last else 4)
            arrived = time.monotonic_ns()
            try:
                dist.all_reduce(x)
            except CollectiveMismatchError:
                out.append((arrived if last else 0, time.monotonic_ns()))
        return out

    def wait_alone(self, cell: int) -> int:
        """Rank 0 waits at an all_reduce nobody else calls; the time it was released."""
        import torch
        import torch.distributed as dist

        from distnb.errors import CollectiveDesyncError
        from distnb.rank import checked

        checked.begin_run(cell)
        if self.rank != 0:
            return 0
        try:
            dist.all_reduce(torch.zeros(1))
        except CollectiveDesyncError:
            return time.monotonic_ns()
        return -1

    def store_path(self, iters: int, rounds: int) -> dict[str, float]:
        """8-element all_reduce with fingerprints through the store, as across hosts."""
        import torch
        import torch.distributed as dist

        from distnb.rank import checked

        checker = checked._checker
        assert checker is not None
        store, session = checker.store, checker.session_id
        hosts = [f"host{r}" for r in range(self.world)]
        checked.uninstall()
        checked.install(
            store, rank=self.rank, world_size=self.world, session_id=session, hosts=hosts
        )
        x = torch.ones(8)
        times: dict[str, list[int]] = {"plain": [], "checked": []}
        try:
            dist.all_reduce(x)
            for _ in range(rounds):
                for mode in times:
                    with checked.unchecked() if mode == "plain" else _nothing():
                        for _ in range(iters):
                            t0 = time.perf_counter_ns()
                            dist.all_reduce(x)
                            times[mode].append(time.perf_counter_ns() - t0)
        finally:
            checked.uninstall()
            checked.install(store, rank=self.rank, world_size=self.world, session_id=session)
        return {m: statistics.median(v) / 1e3 for m, v in times.items()}

    def cpu_cost(self, iters: int) -> dict[str, float]:
        """The check's own CPU time per call, with nobody to wait for: an all_reduce on this
        rank's one-member group, checked (kernel, describe, call site, fingerprint, verdict,
        event) against torch without distnb (uninstalled for the turn); and `Recorder.add`."""
        import torch
        import torch.distributed as dist

        from distnb.rank import checked
        from distnb.rank.checked.recorder import Recorder

        checker = checked._checker
        assert checker is not None
        store, session = checker.store, checker.session_id
        groups = [dist.new_group([r]) for r in range(self.world)]
        mine = groups[self.rank]
        x = torch.ones(8)
        result = {}
        # CPU time of this process, not wall time: on a busy machine a rank is often descheduled
        clock = time.process_time_ns
        for name in ("bare", "checked", "bare", "checked"):
            if name == "bare":
                checked.uninstall()
            best = result.get(name, float("inf"))
            for _ in range(3):
                t0 = clock()
                for _ in range(iters):
                    dist.all_reduce(x, group=mine)
                best = min(best, (clock() - t0) / iters / 1e3)
            result[name] = best
            if name == "bare":
                checked.install(store, rank=self.rank, world_size=self.world, session_id=session)
        rec = Recorder(10_000)
        site = ("f.py", 1, -1, "")
        t0 = clock()
        for i in range(iters):
            rec.add([0, "WORLD", i, "all_reduce", 32, site, 1, 2, 3, None, 2, ""])
        result["record"] = (clock() - t0) / iters / 1e3
        return result


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class Cluster(Spawned):
    def __init__(self, world: int) -> None:
        import torch.distributed as dist

        super().__init__(world, _worker)
        self.check = dist.PrefixStore("check", self.server)

    def ask(self, name: str, **kwargs: Any) -> list[Any]:
        return self.request((name, kwargs))


# --- measurements -------------------------------------------------------------------------------


def measure(
    cluster: Cluster,
    op: str,
    label: str,
    modes: tuple[str, ...],
    iters: int,
    rounds: int,
    gap_ms: float = 0,
) -> Row:
    """Time `op` at size `label` in every mode (the first is the baseline), in rounds that
    rotate the order of the modes; see the module docstring for how ratios are taken."""
    per_mode: dict[str, list[int]] = {m: [] for m in modes}
    per_round: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(rounds):
        k = r % len(modes)  # every mode takes every place in the order, forwards and backwards
        order = modes[k:] + modes[:k]
        for mode in order if r // len(modes) % 2 == 0 else order[::-1]:
            per_rank = cluster.ask(
                "time_op", op=op, numel=SIZES[label], mode=mode, iters=iters, gap_ms=gap_ms
            )
            slowest = [max(ts) for ts in zip(*per_rank, strict=True)]
            per_mode[mode] += slowest
            per_round[mode].append(statistics.median(slowest))
    base = per_round[modes[0]]
    medians = {m: statistics.median(v) / 1e6 for m, v in per_mode.items()}
    each = {m: [a / b for a, b in zip(v, base, strict=True)] for m, v in per_round.items()}
    ratios = {m: statistics.median(v) for m, v in each.items()}
    return cluster.world, op, label, medians, ratios, {m: median_ci(v) for m, v in each.items()}


def time_ops(cluster: Cluster, plan: dict[str, tuple[int, int]]) -> list[Row]:
    rows = []
    for op in OPS:
        for label, (iters, rounds) in plan.items():
            rows.append(measure(cluster, op, label, MODES, iters, rounds))
            print(_row(rows[-1]), flush=True)
    return rows


def time_with_gap(cluster: Cluster, gap_ms: float, quick: bool) -> list[Row]:
    """Collectives with other work between calls: ranks arrive with their usual skew, but the
    early rank has no earlier op to overlap with, so what remains is the check itself."""
    rows = []
    for op, label in (
        ("all_reduce", "8 el"),
        ("all_reduce", "4 MiB"),
        ("broadcast", "4 MiB"),
        ("broadcast", "64 MiB"),
    ):
        iters, rounds = (30, 4) if quick else (30, 20)
        iters //= {"8 el": 1, "4 MiB": 5, "64 MiB": 25}[label]
        modes = ("plain", "again", "checked", "DETAIL")
        row = measure(cluster, op, label, modes, iters, rounds, gap_ms)
        rows.append(row)
        _, _, _, med, ratio, _ = row
        others = " | ".join(f"{m} {med[m]:.3f} ms ({ratio[m]:.2f}x)" for m in modes[1:])
        print(
            f"{cluster.world:>5} | {op}, {gap_ms:g} ms between calls | {label:>6} | "
            f"plain {med['plain']:.3f} ms | {others}",
            flush=True,
        )
    return rows


def time_focus(cluster: Cluster, focus: list[str], rounds: int) -> None:
    """The named `op:size` rows (`all_reduce:4MiB`) in plain, again, barrier and checked only,
    in many rounds, with each ratio's 95% confidence interval: enough to tell 1.05x from 1.20x
    here. `barrier` is plain after an exchange through a shared-memory board, as the checker
    makes, without the check: the floor of a check made before data moves."""
    modes = ("plain", "again", "barrier", "checked")
    sizes = {k.replace(" ", ""): k for k in SIZES}
    for item in focus:
        op, size = item.split(":")
        label = sizes[size]
        row = measure(cluster, op, label, modes, PLAN[label][0], rounds)
        _, _, _, med, ratio, ci = row
        others = " | ".join(
            f"{m} {med[m]:.3f} ms {ratio[m]:.2f}x [{ci[m][0]:.2f}-{ci[m][1]:.2f}]"
            for m in modes[1:]
        )
        print(
            f"{cluster.world:>5} | {op:<11} | {label:>7} | {rounds} rounds | "
            f"plain {med['plain']:.3f} ms | {others}",
            flush=True,
        )


def mismatch_latency(cluster: Cluster, trials: int) -> float:
    per_rank = cluster.ask("mismatch_latency", trials=trials)
    lat = []
    for t in range(trials):
        arrived = per_rank[-1][t][0]
        lat.append(max(r[t][1] for r in per_rank) - arrived)
    return float(statistics.median(lat)) / 1e6


def abort_latency(cluster: Cluster, trials: int) -> float:
    lat = []
    for i in range(trials):
        cell = 10_000 + i
        for conn in cluster.conns:
            conn.send(("wait_alone", {"cell": cell}))
        for conn in cluster.conns[1:]:
            conn.recv()
        time.sleep(0.05)
        set_at = time.monotonic_ns()
        cluster.check.set(keys.abort(cell), "benchmark")
        released = cluster.conns[0].recv()
        lat.append(released - set_at)
    return float(statistics.median(lat)) / 1e6


# --- report -------------------------------------------------------------------------------------


def _row(row: Row) -> str:
    world, op, label, med, ratio, _ = row
    cells = [f"{world:>5}", f"{op:<11}", f"{label:>7}", f"{med['plain']:9.3f}"]
    for mode in MODES[1:]:
        cells.append(f"{med[mode]:9.3f} {ratio[mode]:5.2f}x")
    return " | ".join(cells)


def header() -> str:
    cols = ["ranks", "op".ljust(11), "size".rjust(7), "plain ms".rjust(9)]
    cols += [f"{m} ms (ratio)".rjust(16) for m in MODES[1:]]
    return " | ".join(cols)


def machine() -> str:
    import torch

    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{platform.node()}: {platform.machine()}, {os.cpu_count()} cores, load avg {load}; "
        f"Python {platform.python_version()}, torch {torch.__version__}, gloo on loopback"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations, no 64 MiB")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--extras-only", action="store_true", help="skip the timing tables")
    parser.add_argument(
        "--gap-only", action="store_true", help="only the rows with work between calls"
    )
    parser.add_argument(
        "--focus",
        nargs="+",
        metavar="OP:SIZE",
        help="only these rows (e.g. all_reduce:4MiB broadcast:8el), plain/again/barrier/checked in "
        "--rounds rounds, with 95%% confidence intervals",
    )
    parser.add_argument("--rounds", type=int, default=60, help="rounds per --focus row")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else PLAN
    print("$ python " + " ".join([os.path.relpath(__file__, ROOT), *(argv or sys.argv[1:])]))
    print(machine())
    print(
        "median per iteration of the slowest rank; ratio: median over rounds of the round's "
        f"ratio to plain; modes take turns; {time.ctime()}\n"
    )
    if args.focus:
        print("ratio [its 95% confidence interval]")
        for world in args.ranks:
            cluster = Cluster(world)
            try:
                time_focus(cluster, args.focus, args.rounds)
            finally:
                cluster.close()
        return
    print(header())
    extras: list[dict[str, Any]] = []
    for world in args.ranks:
        cluster = Cluster(world)
        try:
            if not args.extras_only and not args.gap_only:
                time_ops(cluster, plan)
            if not args.extras_only:
                time_with_gap(cluster, 2.0, args.quick)
            if args.gap_only:
                continue
            trials = 10 if args.quick else 30
            extras.append(
                {
                    "world": world,
                    "mismatch": mismatch_latency(cluster, trials),
                    "abort": abort_latency(cluster, 5),
                    "cpu": cluster.ask("cpu_cost", iters=5000 if args.quick else 20000)[0],
                    "store": cluster.ask("store_path", iters=40 if args.quick else 200, rounds=5)[
                        0
                    ],
                }
            )
        finally:
            cluster.close()
    print()
    for e in extras:
        world, mismatch, abort, cpu, store = (
            e["world"],
            e["mismatch"],
            e["abort"],
            e["cpu"],
            e["store"],
        )
        overhead = cpu["checked"] - cpu["bare"]
        print(
            f"{world} ranks: mismatch raised on every rank {mismatch:.2f} ms after the last "
            f"rank arrived; abort key released the waiter in {abort:.2f} ms; "
            f"the check's own CPU time {overhead:.1f} us/call (no peer to wait for); "
            f"recording {cpu['record']:.2f} us/event; store path "
            f"(ranks on different hosts) 8-el all_reduce {store['checked']:.0f} vs "
            f"{store['plain']:.0f} us plain ({store['checked'] / store['plain']:.2f}x)"
        )


if __name__ == "__main__":
    main()
