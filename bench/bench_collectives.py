"""What checking collectives costs: distnb's checked runtime against its peers, on gloo.

    python bench/bench_collectives.py [--quick] [--ranks 2 4]
    python bench/bench_collectives.py --focus all_reduce:4MiB broadcast:8el [--rounds 60]
    python bench/bench_collectives.py --store-only [--rounds 60]

For each world size it starts the ranks once (spawned processes, a TCPStore in this process as
the control plane, gloo on loopback) and times, interleaved round by round so that a busy machine
slows every mode alike:

- plain:       torch.distributed with distnb installed and its checks off
               (`distnb.unchecked()` around the call): the baseline of every ratio but one;
- again:       plain once more, in its own turn: the control, whose ratio to plain shows how far
               two runs of the same code differ here (the noise floor of every other ratio);
- unloaded:    torch.distributed with distnb not installed at all (`checked.uninstall()` for the
               turn, `checked.install` again after it), the op called as in plain: a ratio to
               plain below 1 is what having distnb installed, its checks off, costs;
- barrier:     (`--focus` only) plain after an exchange of a fixed payload through a
               shared-memory board, as the checker makes: what any check made before data
               moves pays for the round trip alone;
- checked:     distnb's checked runtime (`torch.distributed`'s calls checked at the group's
               methods, every other caller at the ops' kernels; fingerprints through shared
               memory);
- DETAIL:      `TORCH_DISTRIBUTED_DEBUG=DETAIL`: a second process group over the same ranks, in
               the same processes as plain, created at debug level DETAIL (so torch wraps its
               gloo in ProcessGroupWrapper), the op called on that group;
- accel:       Accelerate's `gather` / `broadcast` / `reduce` (`PartialState(cpu=True)`), its
               debug mode off; they do other work than plain (`reduce` clones, `gather` is an
               all_gather and a cat), so accel over plain is Accelerate's cost, not a check's;
- accel-debug: the same with `ACCELERATE_DEBUG_MODE=1` (its shape check through
               `gather_object`; without `cpu=True` it silently disables itself on CPU). Its
               check's own cost is accel-debug over accel, which is the ratio printed for it.

all_reduce, all_gather and broadcast at 8 elements, 64 KiB, 4 MiB and 64 MiB of float32. A
machine this small drifts by a factor of two within a minute (plain 4 MiB broadcasts took 1.7 ms
in one run and 3.2 ms in the next), so the modes take turns in short rounds, each mode in every
place of the order in turn. A round of a mode times `iters` calls; an iteration's time is the
slowest rank's, and the round's figure is the median of its iterations. Each mode's printed time
is the median of its rounds' figures, and each ratio is the ratio of two such printed medians
(`ratio_of_medians`): so a ratio always equals the quotient of the times printed beside it. Its
95% interval is the 2.5th to 97.5th percentile of that same ratio over 2,000 resamplings of the
rounds, paired (a resampled round keeps the times of both modes from that round); with the 4
rounds of --quick it says little. Then plain, again, checked and DETAIL at four sizes with 2 ms
of other work before each call, taken alike. Then: the time from the last rank's arrival to the
mismatch error on every rank and how fast the kernel's abort key releases a waiting rank
(median, min and max over the trials), the CPU cost of a check with nobody to wait for (best of
three, against torch without distnb), and the 8-element all_reduce with fingerprints through
the store (as across hosts), plain and checked in 5 rounds taken as above.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from median_ci import ratio_of_medians  # noqa: E402
from results import saved  # noqa: E402
from spawned import Spawned  # noqa: E402

from distnb import keys  # noqa: E402  (after the path: the bench runs from a checkout)

MODES = ("plain", "again", "unloaded", "checked", "DETAIL", "accel", "accel-debug")
GAP_MODES = ("plain", "again", "checked", "DETAIL")
FOCUS_MODES = ("plain", "again", "unloaded", "barrier", "checked")
# each mode's ratio is to plain, but Accelerate's check is measured against Accelerate
BASE = {"accel-debug": "accel"}
OPS = ("all_reduce", "all_gather", "broadcast")
SIZES = {"8 el": 8, "64 KiB": 16 * 1024, "4 MiB": 1024 * 1024, "64 MiB": 16 * 1024 * 1024}
# (iterations per round, rounds) per size, full and --quick
PLAN = {"8 el": (60, 20), "64 KiB": (20, 20), "4 MiB": (4, 30), "64 MiB": (1, 12)}
QUICK = {"8 el": (40, 4), "64 KiB": (15, 4), "4 MiB": (3, 4)}


@dataclass
class Row:
    """One op at one size on one world size: per mode, each round's median ms (of the slowest
    rank's iterations). Every figure printed for the row comes from these, so that a printed
    ratio is the quotient of the printed times beside it."""

    world: int
    op: str
    label: str
    rounds: dict[str, list[float]]

    def ms(self, mode: str) -> float:
        """The mode's printed time: the median of its rounds."""
        return statistics.median(self.rounds[mode])

    def ratio(self, mode: str, base: str = "") -> tuple[float, float, float]:
        """ms(mode) / ms(base, by default the mode's own), and the 95% interval of that ratio
        over the rounds."""
        base = base or BASE.get(mode, "plain")
        return ratio_of_medians(self.rounds[mode], self.rounds[base])


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
        with self._setting(mode):
            call()  # warm up this mode
            dist.barrier()
            return self._iterations(call, iters, gap_ms)

    @contextlib.contextmanager
    def _setting(self, mode: str) -> Iterator[None]:
        """distnb as `mode` needs it: checking ("checked"), not installed at all ("unloaded":
        uninstalled for the turn, installed again after it, on every rank alike, as `cpu_cost`
        does for its "bare" case), or installed with its checks off (every other mode)."""
        from distnb.rank import checked
        from distnb.rank.checked import installation

        if mode == "checked":
            yield
        elif mode == "unloaded":
            checker = installation._checker
            assert checker is not None
            store, session = checker.store, checker.session_id
            checked.uninstall()
            try:
                yield
            finally:
                checked.install(store, rank=self.rank, world_size=self.world, session_id=session)
        else:
            with checked.unchecked():
                yield

    def _after_barrier(self, call: Callable[[], Any]) -> Callable[[], Any]:
        """`call` after an exchange of a fixed payload through a board like the checker's: the
        round trip any check made before data moves must pay, without the check itself."""
        from distnb.rank.checked import exchange, installation

        if self._board is None:
            checker = installation._checker
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

    def store_path(self, iters: int, rounds: int) -> dict[str, list[list[int]]]:
        """8-element all_reduce with fingerprints through the store, as across hosts: per mode,
        per round, each iteration's ns. "signed" is checked through the store signed as a
        control plane off loopback signs it (`distnb.contract.signed`). The modes take turns, each
        first in turn."""
        import torch
        import torch.distributed as dist

        from distnb.contract.signed import SignedStore
        from distnb.rank import checked
        from distnb.rank.checked import installation

        checker = installation._checker
        assert checker is not None
        store, session = checker.store, checker.session_id
        hosts = [f"host{r}" for r in range(self.world)]
        # signed values under keys of their own: a rank that reads a peer's beacon signed in
        # the previous turn (or unsigned, in the next) would take the tag for the value
        signed = SignedStore(dist.PrefixStore("signed", store), b"k" * 32)
        stores = {"plain": store, "checked": store, "signed": signed}
        x = torch.ones(8)
        modes = ("plain", "checked", "signed")
        times: dict[str, list[list[int]]] = {m: [] for m in modes}
        try:
            for r in range(rounds):
                for mode in modes[r % 3 :] + modes[: r % 3]:
                    checked.uninstall()
                    checked.install(
                        stores[mode], rank=self.rank, world_size=self.world, session_id=session,
                        hosts=hosts,
                    )  # fmt: skip
                    dist.all_reduce(x)  # the group's board made outside the timing
                    with self._setting("checked" if mode == "signed" else mode):
                        times[mode].append(self._iterations(lambda: dist.all_reduce(x), iters))
        finally:
            checked.uninstall()
            checked.install(store, rank=self.rank, world_size=self.world, session_id=session)
        return times

    @staticmethod
    def _iterations(call: Callable[[], Any], iters: int, gap_ms: float = 0) -> list[int]:
        """Each of `iters` calls' wall time, ns; `gap_ms` of sleep before each stands for other
        work between collectives, as in a training step."""
        times = []
        for _ in range(iters):
            if gap_ms:
                time.sleep(gap_ms / 1000)
            t0 = time.perf_counter_ns()
            call()
            times.append(time.perf_counter_ns() - t0)
        return times

    def cpu_cost(self, iters: int) -> dict[str, float]:
        """The check's own CPU time per call, with nobody to wait for: an all_reduce on this
        rank's one-member group, checked (kernel, describe, call site, fingerprint, verdict,
        event) against torch without distnb (uninstalled for the turn); and `Recorder.add`."""
        import torch
        import torch.distributed as dist

        from distnb.rank import checked
        from distnb.rank.checked import installation
        from distnb.rank.checked.recorder import Recorder

        checker = installation._checker
        assert checker is not None
        store, session = checker.store, checker.session_id
        groups = [dist.new_group([r]) for r in range(self.world)]
        mine = groups[self.rank]
        x = torch.ones(8)
        result: dict[str, float] = {}
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


class Cluster(Spawned):
    def __init__(self, world: int) -> None:
        import torch.distributed as dist

        super().__init__(world, _worker)
        self.check = dist.PrefixStore("check", self.server)

    def ask(self, name: str, **kwargs: Any) -> list[Any]:
        return self.request((name, kwargs))


# --- measurements -------------------------------------------------------------------------------


def _order(modes: tuple[str, ...], r: int) -> tuple[str, ...]:
    """Round r's order of the modes: every mode takes every place, forwards and backwards, so
    that no mode always follows the same one."""
    k = r % len(modes)
    order = modes[k:] + modes[:k]
    return order if r // len(modes) % 2 == 0 else order[::-1]


def _round_ms(per_rank: list[list[int]]) -> float:
    """A round's figure, ms: the median over its iterations of the slowest rank's time (an
    iteration ends for the job when its last rank is done)."""
    return float(statistics.median(max(ts) for ts in zip(*per_rank, strict=True))) / 1e6


def measure(
    cluster: Cluster,
    op: str,
    label: str,
    modes: tuple[str, ...],
    iters: int,
    rounds: int,
    gap_ms: float = 0,
) -> Row:
    """Time `op` at size `label` in every mode, in rounds that rotate the order of the modes;
    see the module docstring for how times and ratios are taken from the rounds."""
    per_round: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(rounds):
        for mode in _order(modes, r):
            per_rank = cluster.ask(
                "time_op", op=op, numel=SIZES[label], mode=mode, iters=iters, gap_ms=gap_ms
            )
            per_round[mode].append(_round_ms(per_rank))
    return Row(cluster.world, op, label, per_round)


def time_ops(cluster: Cluster, plan: dict[str, tuple[int, int]]) -> None:
    for op in OPS:
        for label, (iters, rounds) in plan.items():
            print(_row(measure(cluster, op, label, MODES, iters, rounds), MODES), flush=True)


def time_with_gap(cluster: Cluster, gap_ms: float, quick: bool) -> None:
    """Collectives with other work between calls: ranks arrive with their usual skew, but the
    early rank has no earlier op to overlap with, so what remains is the check itself. Printed
    in the full table's columns, those of the modes not run here left blank."""
    print(f"{cluster.world} ranks, {gap_ms:g} ms of other work (a sleep) before each call:")
    for op, label in (
        ("all_reduce", "8 el"),
        ("all_reduce", "4 MiB"),
        ("broadcast", "4 MiB"),
        ("broadcast", "64 MiB"),
    ):
        iters, rounds = (30, 4) if quick else (30, 20)
        iters //= {"8 el": 1, "4 MiB": 5, "64 MiB": 25}[label]
        row = measure(cluster, op, label, GAP_MODES, iters, rounds, gap_ms)
        print(_row(row, MODES), flush=True)


def time_focus(
    cluster: Cluster, focus: list[str], rounds: int, modes: tuple[str, ...] = FOCUS_MODES
) -> None:
    """The named `op:size` rows (`all_reduce:4MiB`) in `modes` only, in many rounds: enough to
    tell 1.05x from 1.20x here. `barrier` is plain after an exchange through a shared-memory
    board, as the checker makes, without the check: the floor of a check made before data
    moves. Each row gets a third line: each mode against torch without distnb (unloaded)."""
    sizes = {k.replace(" ", ""): k for k in SIZES}
    for item in focus:
        op, size = item.split(":")
        label = sizes[size]
        row = measure(cluster, op, label, modes, PLAN[label][0], rounds)
        unloaded = [_to_unloaded(row, m) for m in modes]
        print(_row(row, modes) + "\n" + _line(["", "", ""], unloaded), flush=True)


def _to_unloaded(row: Row, mode: str) -> str:
    """The mode over torch without distnb (unloaded) in the same rounds, where both ran."""
    if mode in ("plain", "unloaded") or "unloaded" not in row.rounds:
        return ""
    return _interval(*row.ratio(mode, "unloaded"))


def mismatch_latency(cluster: Cluster, trials: int) -> list[float]:
    """Per trial, ms from the last rank's arrival to the mismatch error on the last rank to
    raise it."""
    per_rank = cluster.ask("mismatch_latency", trials=trials)
    lat = []
    for t in range(trials):
        arrived = per_rank[-1][t][0]
        lat.append((max(r[t][1] for r in per_rank) - arrived) / 1e6)
    return lat


def abort_latency(cluster: Cluster, trials: int) -> list[float]:
    """Per trial, ms from the abort key's setting to the waiting rank's release."""
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
        lat.append((released - set_at) / 1e6)
    return lat


def store_path(cluster: Cluster, iters: int, rounds: int) -> Row:
    """The 8-element all_reduce with fingerprints through the store (ranks as if on different
    hosts), plain and checked, its rounds taken as the table's are."""
    per_rank = cluster.ask("store_path", iters=iters, rounds=rounds)
    per_round = {
        mode: [_round_ms([p[mode][r] for p in per_rank]) for r in range(rounds)]
        for mode in per_rank[0]
    }
    return Row(cluster.world, "all_reduce", "8 el", per_round)


def hmac_us(repeats: int = 7, calls: int = 20_000) -> float:
    """µs per tag as the signed control plane makes it (`SignedStore._tag`: HMAC-SHA256 of the
    key and a 200-byte value, 32-byte secret): the best of `repeats` timings of `calls` tags."""
    import hmac
    import secrets

    secret, key, value = secrets.token_bytes(32), "fp/WORLD/12/0", bytes(200)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            hmac.digest(secret, key.encode() + b"\0" + value, "sha256")
        best = min(best, (time.perf_counter() - started) / calls * 1e6)
    return best


def extras(cluster: Cluster, quick: bool) -> dict[str, Any]:
    """The measurements after the tables; `_extras` prints them."""
    return {
        "world": cluster.world,
        "mismatch": mismatch_latency(cluster, 10 if quick else 30),
        "abort": abort_latency(cluster, 5),
        "cpu": cluster.ask("cpu_cost", iters=5000 if quick else 20000)[0],
        "store": store_path(cluster, iters=40 if quick else 200, rounds=5 if quick else 15),
    }


# --- report -------------------------------------------------------------------------------------

WIDTH = 17  # a mode's column: fits "1.28x [1.14-1.41]" and "accel-debug/accel"


def _ratio(row: Row, mode: str) -> str:
    """`1.26x [1.14-1.41]`: the mode's time over its base's, and its 95% interval."""
    if mode not in row.rounds or BASE.get(mode, "plain") == mode:
        return ""
    return _interval(*row.ratio(mode))


def _interval(ratio: float, low: float, high: float) -> str:
    """`1.26x [1.14-1.41]`, with one decimal from 10 up so that it keeps to its column."""
    ratio_, low_, high_ = (f"{v:.2f}" if v < 10 else f"{v:.1f}" for v in (ratio, low, high))
    return f"{ratio_}x [{low_}-{high_}]"


def _row(row: Row, modes: tuple[str, ...]) -> str:
    """Two lines: each mode's time, then under it its ratio to its base; blank where the row
    did not run the mode."""
    times = [f"{row.ms(m):.3f} ms" if m in row.rounds else "" for m in modes]
    ratios = [_ratio(row, m) for m in modes]
    return "\n".join(
        [_line([str(row.world), row.op, row.label], times), _line(["", "", ""], ratios)]
    )


def _line(lead: list[str], cells: list[str]) -> str:
    """ranks, op and size, then the modes' cells, each in its column."""
    ranks, op, size = lead
    columns = [ranks.rjust(5), op.ljust(11), size.rjust(7)]
    return " | ".join(columns + [c.rjust(WIDTH) for c in cells]).rstrip(" |")


def header(modes: tuple[str, ...], to_unloaded: bool = False) -> str:
    """The modes' names over their times, and which ratio is printed under each (and, with
    `to_unloaded`, on a third line: each mode over torch without distnb)."""
    bases = [BASE.get(m, "plain") for m in modes]
    ratios = ["" if b == m else f"{m}/{b}" for m, b in zip(modes, bases, strict=True)]
    lines = [_line(["ranks", "op", "size"], list(modes)), _line(["", "", ""], ratios)]
    if to_unloaded:
        third = ["" if m in ("plain", "unloaded") else f"{m}/unloaded" for m in modes]
        lines.append(_line(["", "", ""], third))
    return "\n".join(lines)


def _spread(values: list[float]) -> str:
    """Trials' median and range: a handful of trials is too few for an interval."""
    return (
        f"{statistics.median(values):.2f} ms (min {min(values):.2f}, max {max(values):.2f}, "
        f"{len(values)} trials)"
    )


def _extras(e: dict[str, Any]) -> str:
    """What `extras` measured on one world size, a line per measurement."""
    cpu, store = e["cpu"], e["store"]
    return "\n".join(
        [
            f"{e['world']} ranks:",
            f"  mismatch raised on every rank {_spread(e['mismatch'])} after the last rank arrived",
            f"  abort key released the waiter in {_spread(e['abort'])}",
            f"  the check's own CPU time {cpu['checked'] - cpu['bare']:.1f} us/call (checked "
            "minus torch without distnb, each the best of 3; no peer to wait for); recording "
            f"{cpu['record']:.2f} us/event",
            _store_line(store),
        ]
    )


def _store_line(store: Row) -> str:
    return (
        "  store path (ranks on different hosts), 8-el all_reduce: checked "
        f"{store.ms('checked') * 1e3:.0f} us, plain {store.ms('plain') * 1e3:.0f} us: "
        f"{_interval(*store.ratio('checked'))} ({len(store.rounds['plain'])} rounds); signed "
        f"(a control plane off loopback) {store.ms('signed') * 1e3:.0f} us: "
        f"{_interval(*store.ratio('signed', 'checked'))} of checked"
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
        help="only these rows (e.g. all_reduce:4MiB broadcast:8el), in "
        f"{'/'.join(FOCUS_MODES)}, in --rounds rounds",
    )
    parser.add_argument("--rounds", type=int, default=60, help="rounds per --focus row")
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=("barrier", *MODES),
        default=list(FOCUS_MODES),
        help="the modes of the --focus rows",
    )
    parser.add_argument(
        "--store-only", action="store_true", help="only the store path, in --rounds rounds"
    )
    args = parser.parse_args(argv)
    mode = (
        "focus"
        if args.focus
        else "extras"
        if args.extras_only
        else "store"
        if args.store_only
        else "full"
    )
    with saved(f"collectives-{mode}"):
        run(args)


def run(args: argparse.Namespace) -> None:
    plan = QUICK if args.quick else PLAN
    print(
        "# gloo on loopback; plain = distnb loaded, its checks off (`distnb.unchecked()`); "
        "unloaded = torch without distnb\n"
        "time: median over rounds of a round's median iteration (the slowest rank's time); "
        "ratio: the quotient of two such printed times, to plain (accel-debug: to accel), "
        "[95% interval] from a paired bootstrap over the rounds; modes take turns\n"
    )
    if args.store_only:
        for world in args.ranks:
            cluster = Cluster(world)
            try:
                store = store_path(cluster, iters=200, rounds=args.rounds)
                print(f"{world} ranks:\n{_store_line(store)}")
            finally:
                cluster.close()
        return
    if args.focus:
        modes = tuple(args.modes)
        print(f"{args.rounds} rounds per row")
        print(header(modes, to_unloaded="unloaded" in modes))
        for world in args.ranks:
            cluster = Cluster(world)
            try:
                time_focus(cluster, args.focus, args.rounds, modes)
            finally:
                cluster.close()
        return
    print(header(MODES))
    measured: list[dict[str, Any]] = []
    for world in args.ranks:
        cluster = Cluster(world)
        try:
            if not args.extras_only and not args.gap_only:
                time_ops(cluster, plan)
            if not args.extras_only:
                time_with_gap(cluster, 2.0, args.quick)
            if not args.gap_only:
                measured.append(extras(cluster, args.quick))
        finally:
            cluster.close()
    print()
    for e in measured:
        print(_extras(e))
    if measured:
        print(f"one HMAC-SHA256 tag of a 200-byte value (best of 7): {hmac_us():.2f} us")


if __name__ == "__main__":
    main()
