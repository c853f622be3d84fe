"""How the checks grow with the ranks and hosts, measured here and modelled toward real sizes.

    python bench/bench_scale.py [--part collectives|sessions|model|memory] [--ranks 4 8 16]
                                 [--rounds 8] [--iters 40]

For each world size it starts the ranks once (spawned processes around a TCPStore this process
hosts, as bench_collectives does; gloo on loopback) and times an 8-element all_reduce, checked
and unchecked, in rounds that rotate the order of the modes (each round: one turn of every
mode; a turn times `iters` calls; its figure is the median over its iterations of the slowest
rank's time):

- plain:     distnb installed, checks off (`distnb.unchecked()`): every ratio's baseline;
- again:     plain once more in its own turn: the noise floor;
- 1 host:    checked, every rank on one host (shared memory only; from `FLAT_MAX` ranks on,
             through a leader);
- 1 host flat: the same, every rank collecting every peer's post (as below `FLAT_MAX`);
- N hosts:   checked, ranks split into `hosts` of equal size (`install(hosts=...)`: ranks with
             the same host name share a shared-memory board, the others meet through the store,
             exactly the path taken across machines; here the machines are host names on one
             machine, so the store's round trips are loopback's, not a network's);
- per rank:  checked, every rank a host of its own (what `DISTNB_SHM=0` does: the store path
             for every pair of ranks, the worst case of a cross-host job): below
             `SPREAD_HOSTS` hosts every leader reads every other's summary;
- per rank, spread: the same, the leaders agreeing by dissemination in log2 H rounds (the
             path from `SPREAD_HOSTS` hosts on), for the comparison.

Each mode reinstalls the checked runtime with its hosts before its turn (and makes the group's
board with one call outside the timing).

`--part model`: fitted to the store's and shared memory's costs measured here, what a checked
collective pays at 64 to 4,096 ranks, 1 and 8 ranks per host, both ways among the hosts'
leaders; next to it, what one verdict on an attached job of as many ranks costs (`status()`,
`%dist_attach`), from its parts measured here on a real attached job of 2 ranks, `Link.ask`,
the replies' codec and the judgement on records of N ranks (`scale_attach`); it says what it
assumes. `--part sessions`: starts and empty cells against raw ipyparallel; `--part memory`: a
long session's memory.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import os
import statistics
import sys
import time
import warnings
from multiprocessing.connection import Connection

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from median_ci import ratio_of_medians  # noqa: E402
from results import saved  # noqa: E402
from spawned import Spawned  # noqa: E402

from distnb.rank.checked.exchange.tiered import SPREAD_HOSTS  # noqa: E402
from distnb.rank.checked.groups import FLAT_MAX  # noqa: E402


def layout(world: int, hosts: int) -> list[str]:
    """Host names for `world` ranks in `hosts` equal blocks (`hosts == world`: one per rank)."""
    return [f"host{r * hosts // world}" for r in range(world)]


def _worker(rank: int, world: int, port: int, conn: Connection) -> None:
    warnings.simplefilter("ignore")
    os.environ.update(OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist

    from distnb.rank import checked
    from distnb.rank.checked import groups
    from distnb.rank.checked.exchange import tiered

    FLAT_MAX, SPREAD = groups.FLAT_MAX, tiered.SPREAD_HOSTS
    torch.set_num_threads(1)
    client = dist.TCPStore("127.0.0.1", port, None, False, timeout=datetime.timedelta(seconds=120))
    dist.init_process_group(
        "gloo", store=dist.PrefixStore("pg", client), rank=rank, world_size=world
    )
    store = dist.PrefixStore("check", client)
    session = f"scale{port}"
    checked.install(store, rank=rank, world_size=world, session_id=session)
    conn.send("ready")
    x = torch.ones(8)
    while True:
        request = conn.recv()
        if request is None:
            break
        hosts, iters = request
        if hosts:
            groups.FLAT_MAX = 10**6 if hosts[0] == "flat" else FLAT_MAX
            tiered.SPREAD_HOSTS = 2 if hosts[0].startswith("spread:") else SPREAD
            checked.install(store, rank=rank, world_size=world, session_id=session, hosts=hosts)
        dist.all_reduce(x)  # the group's board made outside the timing
        dist.barrier()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter_ns()
            if hosts:
                dist.all_reduce(x)
            else:
                with checked.unchecked():
                    dist.all_reduce(x)
            times.append(time.perf_counter_ns() - t0)
        conn.send(times)
    checked.uninstall()
    dist.destroy_process_group()


def _round_ms(per_rank: list[list[int]]) -> float:
    return float(statistics.median(max(ts) for ts in zip(*per_rank, strict=True))) / 1e6


def modes_for(world: int) -> dict[str, list[str] | None]:
    """mode -> hosts to install with (None: plain, unchecked)."""
    modes: dict[str, list[str] | None] = {"plain": None, "again": None, "1 host": [""] * world}
    if world >= FLAT_MAX:
        modes["1 host flat"] = ["flat"] * world
    for h in (2, 4):
        if world > h:
            modes[f"{h} hosts"] = layout(world, h)
    modes["per rank"] = layout(world, world)
    if world < SPREAD_HOSTS:  # the leaders' agreement by dissemination, as from SPREAD_HOSTS
        modes["per rank, spread"] = [f"spread:{h}" for h in layout(world, world)]
    return modes


def measure(world: int, rounds: int, iters: int) -> dict[str, list[float]]:
    ranks = Spawned(world, _worker)
    modes = modes_for(world)
    names = list(modes)
    per_round: dict[str, list[float]] = {m: [] for m in names}
    try:
        for r in range(rounds):
            k = r % len(names)
            order = names[k:] + names[:k]
            for name in order if r // len(names) % 2 == 0 else order[::-1]:
                per_round[name].append(_round_ms(ranks.request((modes[name], iters))))
    finally:
        ranks.close()
    return per_round


def row(world: int, rounds: dict[str, list[float]]) -> str:
    plain = rounds["plain"]
    cells = [f"{world:5d}", f"{statistics.median(plain):7.3f}"]
    for name, values in rounds.items():
        if name == "plain":
            continue
        ratio, low, high = ratio_of_medians(values, plain)
        extra = statistics.median(values) - statistics.median(plain)
        cells.append(f"{name}: {ratio:.2f}x [{low:.2f}-{high:.2f}] {extra:+.2f} ms")
    return "  ".join(cells)


def sessions(world: int, repeats: int, cells: int) -> dict[str, list[float]]:
    """Starts (distnb against raw ipyparallel + torch + gloo, alternating which goes first) and
    empty cells (`session.run("")` against `%px`'s execute + wait for output, rounds rotated)."""
    from bench_session import cell_costs, distnb_start, raw_start_stopped

    times: dict[str, list[float]] = {"distnb start": [], "raw start": []}
    for i in range(repeats):
        if i % 2 == 0:
            times["raw start"].append(raw_start_stopped(world))
        elapsed, session = distnb_start(world)
        times["distnb start"].append(elapsed)
        try:
            if i == 0:
                cell, _ = cell_costs(session, cells)
                times["distnb cell"], times["px cell"] = cell["distnb"], cell["px"]
        finally:
            session.stop()
        if i % 2 == 1:
            times["raw start"].append(raw_start_stopped(world))
    return times


def session_rows(world: int, t: dict[str, list[float]]) -> str:
    def ratio(ours: list[float], peer: list[float]) -> str:
        r, low, high = ratio_of_medians(ours, peer)
        return f"{r:.2f}x [{low:.2f}-{high:.2f}]"

    start = ratio(t["distnb start"], t["raw start"])
    cell = ratio(t["distnb cell"], t["px cell"])
    med = {k: statistics.median(v) for k, v in t.items()}
    return (
        f"{world:5d}  start {med['distnb start']:6.1f} s vs raw {med['raw start']:6.1f} s: "
        f"{start}   empty cell {med['distnb cell'] * 1e3:6.1f} ms vs %px "
        f"{med['px cell'] * 1e3:6.1f} ms: {cell}"
    )


# --- memory over a long session ---------------------------------------------------------------


def memory(world: int, cells: int, checkpoints: int = 8) -> None:
    """Memory of the kernel (this process) and of each rank over `cells` cells, each a checked
    all_reduce and a line of output per rank: USS (pages no other process maps) at evenly spaced
    cells, and the growth per cell between two checkpoints.

    The kernel's client keeps the signature of every message it received (jupyter_client's
    replay protection: `Session.digest_history`, capped at `digest_history_size`, 65,536, then
    culled by a tenth), so the kernel grows until the cap and then holds; the growth is taken
    from the first checkpoint at which the history is full (from the second, if none is), and
    the history's size is printed at each checkpoint."""
    import psutil

    import distnb

    session = distnb.start(world, progress=False)
    try:
        pids = [r.pid for r in session.ranks]
        signed = session.cluster.client.session
        me = psutil.Process()
        at: list[tuple[int, float, list[float], int]] = []
        took: list[float] = []
        step = max(1, cells // checkpoints)
        for cell in range(1, cells + 1):
            t0 = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):  # the ranks' lines, not the report's
                session.run(f"x = torch.ones(8)\ndist.all_reduce(x)\nprint({cell}, rank)")
            took.append(time.perf_counter() - t0)
            if cell % step == 0 or cell == 1:
                ranks = [psutil.Process(p).memory_full_info().uss / 2**20 for p in pids]
                kernel = me.memory_full_info().uss / 2**20
                at.append((cell, kernel, ranks, len(signed.digest_history)))
    finally:
        session.stop()
    cap = signed.digest_history_size
    print(
        f"# {world} ranks, {cells} cells (a checked all_reduce and a printed line per rank); "
        f"a cell took {statistics.median(took):.2f} s (median)"
    )
    print(f"# cell  kernel USS MiB  signatures kept (cap {cap})  ranks' USS MiB: median [min-max]")
    for cell, kernel, ranks, kept in at:
        low, high = min(ranks), max(ranks)
        print(
            f"{cell:6d}  {kernel:14.1f}  {kept:26d}  {statistics.median(ranks):8.1f} "
            f"[{low:.1f}-{high:.1f}]"
        )
    full = [i for i, point in enumerate(at) if point[3] >= 0.9 * cap]
    (c0, k0, r0, _), (c1, k1, r1, _) = at[full[0] if full and full[0] < len(at) - 1 else 1], at[-1]
    per_cell = 1024 / (c1 - c0)
    since = "the signatures' cap" if full and c0 == at[full[0]][0] else "the second checkpoint"
    print(
        f"growth per cell from cell {c0} to {c1} ({since}): kernel {(k1 - k0) * per_cell:.2f} "
        f"KiB, rank median {(statistics.median(r1) - statistics.median(r0)) * per_cell:.2f} KiB"
    )


def store_costs(repeats: int = 300) -> tuple[float, float]:
    """(a, b) in seconds: a store request's round trip (a one-key `multi_get`) and each key more
    that a `multi_get` reads, from this process to a TCPStore server in a thread here (loopback)."""
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, None, False)
    value = b"x" * 120  # a summary: a marker and a core
    sizes = (1, 16, 64, 256)
    for k in range(max(sizes)):
        client.set(f"k{k}", value)
    times = {}
    for k in sizes:
        names = [f"k{i}" for i in range(k)]
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            client.multi_get(names)
            samples.append(time.perf_counter() - t0)
        times[k] = statistics.median(samples)
    b = (times[256] - times[1]) / 255
    # a `set` is not answered (the client sends it and goes on): a request's round trip is a
    # one-key read's
    return times[1], max(b, 0.0)


def server_cost(clients: int = 8, repeats: int = 400) -> float:
    """c in seconds: the store server's own time per one-key request, from its throughput when
    `clients` connections (threads here; the GIL is released while each waits) ask at once."""
    import threading

    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    conns = [dist.TCPStore("127.0.0.1", server.port, None, False) for _ in range(clients)]
    conns[0].set("k", b"x" * 120)
    start = threading.Barrier(clients + 1)

    def ask(client: dist.TCPStore) -> None:
        start.wait()
        for _ in range(repeats):
            client.multi_get(["k"])

    threads = [threading.Thread(target=ask, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return (time.perf_counter() - t0) / (clients * repeats)


def _echo(rank: int, world: int, port: int, path: str, conn: Connection) -> None:
    from distnb.rank.checked import exchange

    board = exchange.ShmBoard(path, 2, 2, 256)
    conn.send("ready")
    n = conn.recv()
    for stamp in range(1, n + 1):
        exchange.collect(board, [0], stamp, lambda *_: None)
        board.post(1, stamp, b"F")
    conn.send(None)
    conn.recv()


def shm_hop(n: int = 2000) -> float:
    """Half a ping-pong between two processes through a `ShmBoard` (a post and the peer's
    wake-up), seconds, median."""
    from distnb.rank.checked import exchange

    path = exchange.shm_path(f"scale{os.getpid()}", "hop")
    board = exchange.ShmBoard(path, 2, 2, 256)
    peer = Spawned(1, _echo, path)
    try:
        peer.conns[0].send(n)
        samples = []
        for stamp in range(1, n + 1):
            t0 = time.perf_counter()
            board.post(0, stamp, b"F")
            exchange.collect(board, [1], stamp, lambda *_: None)
            samples.append(time.perf_counter() - t0)
        peer.conns[0].recv()
    finally:
        peer.close()
        board.close(unlink=True)
    return statistics.median(samples) / 2


def leaders(hosts: int, a: float, b: float, c: float, spread: bool) -> float:
    """Seconds the leaders of `hosts` hosts take to agree, on the critical path, when the one
    store server answers requests in turn (c each, b per key more) and a request's round trip
    is a: each of the H leaders reads the H-1 other summaries in one request (their H requests
    queue at the server), or, by dissemination, log2 H rounds of one one-key read per leader
    (each round's H requests queue)."""
    if hosts <= 1:
        return 0.0
    if not spread:
        return a + hosts * (c + b * (hosts - 1))
    return (hosts - 1).bit_length() * (a + hosts * c)


def crossover(a: float, b: float, c: float) -> int:
    """The fewest hosts from which dissemination is the faster for every larger count too (up
    to 16,384: the model's `SPREAD_HOSTS`)."""
    slower = [
        h for h in range(2, 1 << 14) if leaders(h, a, b, c, True) >= leaders(h, a, b, c, False)
    ]
    return max(slower, default=1) + 1


def model() -> None:
    import scale_attach

    a, b = store_costs()
    c = server_cost()
    h = shm_hop()
    sizes = (64, 256, 1024, 4096)
    attached = scale_attach.measure(c, sizes)
    print(
        f"# measured here: store round trip a = {a * 1e6:.0f} us, each key more in a multi_get "
        f"b = {b * 1e6:.2f} us, the server's time per request c = {c * 1e6:.1f} us (8 clients "
        f"at once), shared-memory hop h = {h * 1e6:.0f} us\n"
        "# assumed: one store server answering one request at a time; each leader polls once "
        "after the last post (no repeated polls); a network's round trip adds to a alone; two "
        "shared-memory hops per collective on a host of 8 (a post, the leader's result)\n"
        f"# dissemination is the faster from {crossover(a, b, c)} hosts on "
        f"({crossover(a + 100e-6, b, c)} with 100 us of network more per round trip); distnb "
        f"uses it from {SPREAD_HOSTS}\n"
        "# attached s: one verdict on an attached job of as many ranks (status(), as "
        "%dist_attach shows it), each rank with 16 or 1,000 collectives recorded (1,000: what "
        "the verdict asks for); the same at any number of ranks per host (the notebook asks "
        "every rank's agent itself, through the job's one store); its parts below\n"
        "# ranks  per host  hosts  leaders read all ms  dissemination ms  attached s, 16 calls"
        "  attached s, 1,000 calls"
    )
    for per_host in (1, 8):
        for n in sizes:
            hosts = n // per_host
            local = 2 * h if per_host > 1 else 0.0
            flat = local + leaders(hosts, a, b, c, False)
            spread = local + leaders(hosts, a, b, c, True)
            early, full = (attached.verdict(n, k).total for k in (16, scale_attach.ASKED))
            print(
                f"{n:7d}  {per_host:8d}  {hosts:5d}  {flat * 1e3:19.2f}  {spread * 1e3:16.2f}  "
                f"{early:19.2f}  {full:23.2f}"
            )
    scale_attach.report(attached, sizes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--part", choices=("collectives", "sessions", "model", "memory"), default="collectives"
    )
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=2, help="starts of each kind (sessions)")
    parser.add_argument(
        "--cells", type=int, default=40, help="rounds of empty cells (sessions); cells (memory)"
    )
    parser.add_argument("--name", default="", help="bench/results/<name>.txt")
    args = parser.parse_args()
    with saved(args.name or f"scale-{args.part}"):
        if args.part == "model":
            model()
            return
        if args.part == "memory":
            for world in args.ranks:
                memory(world, args.cells)
            return
        if args.part == "sessions":
            print(
                f"# start: {args.repeats} of each, alternating which goes first; empty cell: "
                f"{args.cells} rounds, order rotated; ratio [95% interval, paired bootstrap]"
            )
            for world in args.ranks:
                print(session_rows(world, sessions(world, args.repeats, args.cells)), flush=True)
            return
        print(
            "# checked 8-element all_reduce against plain (checks off) in the same run; "
            f"{args.rounds} rounds of {args.iters} calls per mode, modes rotated\n"
            "# ranks  plain ms  mode: ratio to plain [95% interval] extra ms per call"
        )
        for world in args.ranks:
            print(row(world, measure(world, args.rounds, args.iters)), flush=True)


if __name__ == "__main__":
    main()
