"""How the checks grow with the ranks and hosts, measured here and modelled toward real sizes.

    python bench/bench_scale.py [--ranks 4 8 16] [--rounds 8] [--iters 40]

For each world size it starts the ranks once (spawned processes around a TCPStore this process
hosts, as bench_collectives does; gloo on loopback) and times an 8-element all_reduce, checked
and unchecked, in rounds that rotate the order of the modes (each round: one turn of every
mode; a turn times `iters` calls; its figure is the median over its iterations of the slowest
rank's time):

- plain:     distnb installed, checks off (`distnb.unchecked()`): every ratio's baseline;
- again:     plain once more in its own turn: the noise floor;
- 1 host:    checked, every rank on one host (shared memory only);
- N hosts:   checked, ranks split into `hosts` of equal size (`install(hosts=...)`: ranks with
             the same host name share a shared-memory board, the others meet through the store,
             exactly the path taken across machines; here the machines are host names on one
             machine, so the store's round trips are loopback's, not a network's);
- per rank:  checked, every rank a host of its own (what `DISTNB_SHM=0` does: the store path
             for every pair of ranks, the worst case of a cross-host job).

Each mode reinstalls the checked runtime with its hosts before its turn (and makes the group's
board with one call outside the timing). Then a model (`--model`): fitted to the measured
per-host-count costs, it prints what a checked collective would pay at 64, 256 and 1,024 ranks
in 8-rank hosts; it says what it assumes.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
import warnings
from multiprocessing.connection import Connection
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from median_ci import ratio_of_medians  # noqa: E402
from results import saved  # noqa: E402
from spawned import Spawned  # noqa: E402


def layout(world: int, hosts: int) -> list[str]:
    """Host names for `world` ranks in `hosts` equal blocks (`hosts == world`: one per rank)."""
    return [f"host{r * hosts // world}" for r in range(world)]


def _worker(rank: int, world: int, port: int, conn: Connection) -> None:
    warnings.simplefilter("ignore")
    os.environ.update(OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist

    from distnb.rank import checked

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
    for h in (2, 4):
        if world > h:
            modes[f"{h} hosts"] = layout(world, h)
    modes["per rank"] = layout(world, world)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--name", default="scale-collectives", help="bench/results/<name>.txt")
    args = parser.parse_args()
    with saved(args.name):
        print(
            "# checked 8-element all_reduce against plain (checks off) in the same run; "
            f"{args.rounds} rounds of {args.iters} calls per mode, modes rotated\n"
            "# ranks  plain ms  mode: ratio to plain [95% interval] extra ms per call"
        )
        for world in args.ranks:
            print(row(world, measure(world, args.rounds, args.iters)), flush=True)


if __name__ == "__main__":
    main()
