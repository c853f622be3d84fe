"""Replica checks: how long `%dist_diff model --grads` takes on a ~100 M-parameter model.

    python bench/bench_replicas.py [--rounds 5] [--width 4096] [--layers 6]
    python bench/bench_replicas.py --watch [--rounds 5]
    python bench/bench_replicas.py --digest [--rounds 5] [--size 100000000] [--device cpu]
                                   [--threads N]

Three ways to learn whether 2 ranks hold the same parameters and gradients, each timed from the
kernel as one cell-sized request, interleaved in rounds whose order rotates:

- `floor`: a plain read of the same tensors on each rank (`t.sum()`, in their own dtype): what
  any check of every byte must at least cost;
- `distnb`: `session.diff("model", grads=True)`: digests on each rank, sent back through the
  session, compared in the kernel;
- `megatron`: Megatron-LM's method (`check_param_hashes_across_dp_replicas`): SHA-1 of each
  parameter's bytes on the CPU, the hashes all-gathered over the process group and compared.

Each ratio is the ratio of the medians printed, with its 95% interval (paired bootstrap over
rounds).

`--watch` measures the watch instead: a DDP training step (a ~10 M-parameter MLP, 4 x
Linear(1600, 1600), batch 16, Adam) unwatched, watched every step (`diff_watch`, parameters
before each forward; `--optim`: also Adam's state after each step), and unwatched again (the
control), each a cell of 10 steps, interleaved in rounds whose order rotates. Each variant trains
a model of its own, identical to the others; the watches are set once, before the rounds, so a
cell times training steps only.

`--digest` measures the digest alone, in this process (no ranks; `--device cuda` on a GPU), on
one `--size`-element float32 tensor and on 100 smaller ones (25 x Linear(1024, 1024)'s weight
and bias with a LayerNorm's two vectors): a plain read (`t.sum()` of each, then one read to the
host), the previous digest (a linear sum of words times weights: kept here, and only here, to
time against; it misses sign flips, issue 30), the digest (`_bits`) and Megatron's SHA-1 of each
tensor's bytes, interleaved in rounds whose order rotates.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from median_ci import ratio_of_medians

import distnb

SETUP = """\
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear({width}, {width}) for _ in range({layers})])
model(torch.randn(4, {width})).sum().backward()
tensors = [t for p in model.parameters() for t in (p, p.grad)]
"""
FLOOR = "sums = [t.sum() for t in tensors]"
MEGATRON = """\
import hashlib
hashes = [hashlib.sha1(t.detach().cpu().numpy().tobytes()).digest() for t in tensors]
mine = torch.tensor([list(h) for h in hashes], dtype=torch.uint8)
every = [torch.empty_like(mine) for _ in range(world_size)]
dist.all_gather(every, mine)
agree = all(torch.equal(every[0], e) for e in every)
"""


WATCH_SETUP = """\
from torch.nn.parallel import DistributedDataParallel as DDP
def make():
    torch.manual_seed(0)
    ddp = DDP(torch.nn.Sequential(*[torch.nn.Linear(1600, 1600) for _ in range(4)]))
    return ddp, torch.optim.Adam(ddp.parameters(), lr=1e-4)
def steps(ddp, opt, n=10):
    for _ in range(n):
        opt.zero_grad()
        ddp(torch.randn(16, 1600)).sum().backward()
        opt.step()
models = {name: make() for name in ("plain", "watched", "optim")}
ddp_watched, opt_watched = models["watched"]
ddp_optim, opt_optim = models["optim"]
for ddp, opt in models.values():
    steps(ddp, opt, 2)
"""


def interleaved(variants: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """Each variant's time in every round, the order rotating so that each goes first in turn."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            started = time.perf_counter()
            variants[name]()
            times[name].append(time.perf_counter() - started)
    return times


def table(times: dict[str, list[float]], base: str, unit: str, scale: float) -> None:
    """Median time (in `unit`: seconds times `scale`), the ratio of that median to `base`'s and
    its 95% interval; then the spread of the times (lowest-highest)."""
    print(f"{'variant':<14} {unit:>9}  vs {base} [95% CI]  spread")
    for name, values in times.items():
        ratio, low, high = ratio_of_medians(values, times[base])
        print(
            f"{name:<14} {statistics.median(values) * scale:>9.3f}  "
            f"{ratio:.3f}x [{low:.3f}-{high:.3f}]  "
            f"{min(values) * scale:.3f}-{max(values) * scale:.3f}"
        )


def bench_watch(rounds: int) -> None:
    with distnb.start(2, progress=False) as s:
        s.run(WATCH_SETUP)
        s.diff_watch("ddp_watched")  # watched for the whole run: each cell times steps only
        s.diff_watch("ddp_optim", optim="opt_optim")

        def cell(model: str) -> Callable[[], None]:
            return lambda: s.run(f"steps(*models[{model!r}])")

        variants = {
            "unwatched": cell("plain"),
            "watched": cell("watched"),
            "watched+optim": cell("optim"),
            "again": cell("plain"),
        }
        times = interleaved(variants, rounds)
        assert s.diff_report("ddp_watched").report.first is None  # each step was digested
    print(f"# DDP 10M MLP, Adam, 2 ranks: cells of 10 steps, {rounds} rounds")
    table(times, "unwatched", "ms/step", 1e3 / 10)


# THE PREVIOUS DIGEST (before issue 30), as it was in distnb/rank/replicas/__init__.py; kept
# only to time the digest against. Do not use it: a linear sum of words times weights modulo
# 2**64 loses a top-bit (sign) difference times an even weight, and pairs of them whatever the
# weights.
_COLS = 256
_A, _B = 0x9E3779B97F4A7C15 - 2**64, 0x632BE59BD9B4E019
_A2, _B2 = 0x2545F4914F6CDD1D, 0x5851F42D4C957F2D
_WEIGHTS: dict[tuple[Any, int], Any] = {}


def previous_bits(tensors: list[Any]) -> list[str]:
    import torch

    sums: dict[Any, list[Any]] = {}
    order = []
    for t in tensors:
        sums.setdefault(t.device, []).append(_previous_digest(_previous_words(t)))
        order.append((t.device, len(sums[t.device]) - 1))
    read = {device: torch.stack(hs).tolist() for device, hs in sums.items()}
    return [f"{read[device][i] % 2**64:016x}" for device, i in order]


def _previous_words(t: Any) -> Any:
    import torch

    flat = t.detach().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    elif flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    raw = flat.contiguous().view(torch.uint8)
    whole = raw.numel() // 8 * 8
    if raw.storage_offset() % 8:
        raw = raw.clone()
    words = raw[:whole].view(torch.int64)
    if whole == raw.numel():
        return words
    return torch.cat([words, raw[whole:].to(torch.int64)])


def _previous_digest(words: Any) -> Any:
    full, tail = divmod(words.numel(), _COLS)
    cols = _previous_weights(words.device, _COLS, _A, _B)
    by_row = _previous_weights(words.device, full + 1, _A2, _B2)
    h = _previous_dot(words[full * _COLS :], cols[:tail]) * by_row[full]
    if full:
        rows = _previous_row_sums(words[: full * _COLS].view(full, _COLS), cols)
        h = h + _previous_dot(rows, by_row[:full])
    return h


def _previous_row_sums(matrix: Any, cols: Any) -> Any:
    import torch

    return torch.mv(matrix, cols) if matrix.device.type == "cpu" else (matrix * cols).sum(1)


def _previous_dot(x: Any, w: Any) -> Any:
    import torch

    return torch.dot(x, w) if x.device.type == "cpu" else (x * w).sum()


def _previous_weights(device: Any, n: int, a: int, b: int) -> Any:
    import torch

    have = _WEIGHTS.get((device, a))
    if have is None or have.numel() < n:
        at = torch.arange(max(n, 2 * (have.numel() if have is not None else 0)), device=device)
        have = _WEIGHTS[(device, a)] = at * a + b
    return have[:n]


# END OF THE PREVIOUS DIGEST


def bench_digest(rounds: int, size: int, device: str, threads: int) -> None:
    import hashlib
    import os

    import torch

    from distnb.rank.replicas.digest import _bits

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    if threads:
        torch.set_num_threads(threads)  # ranks run with OMP_NUM_THREADS = cores // ranks
    torch.manual_seed(0)
    one = [torch.randn(size, device=device)]
    many = [
        t
        for _ in range(25)
        for t in (torch.randn(1024, 1024, device=device), *torch.randn(3, 1024, device=device))
    ]
    t = torch.tensor([1.0, 2.0, 3.0, 4.0])
    u = torch.tensor([1.0, 2.0, 3.0, -4.0])
    assert previous_bits([t]) == previous_bits([u]) and _bits([t]) != _bits([u])  # issue 30
    assert _bits(one + many) == _bits([x.cpu() for x in one + many])  # the same everywhere

    def timed(f: Callable[[list[Any]], Any], tensors: list[Any]) -> Callable[[], None]:
        def run() -> None:
            sync()
            f(tensors)
            sync()

        return run

    def floor(ts: list[Any]) -> list[float]:
        return torch.stack([x.sum() for x in ts]).tolist()  # type: ignore[no-any-return]

    def sha1(ts: list[Any]) -> list[bytes]:
        return [hashlib.sha1(x.detach().cpu().numpy().tobytes()).digest() for x in ts]

    where = torch.cuda.get_device_name() if device.startswith("cuda") else f"{os.cpu_count()} CPUs"
    print(f"# {device} ({where}), torch {torch.__version__}, {torch.get_num_threads()} threads")
    for label, tensors in ((f"1 x {size} float32", one), (f"{len(many)} tensors", many)):
        elements = sum(x.numel() for x in tensors)
        variants = {
            name: timed(f, tensors)
            for name, f in (
                ("floor", floor),
                ("previous", previous_bits),
                ("digest", _bits),
                ("sha1", sha1),
            )
        }
        for run in variants.values():  # warm: the keys, the allocator
            run()
        times = interleaved(variants, rounds)
        print(f"# {label}: {elements} elements, {4 * elements / 1e6:.0f} MB, {rounds} rounds")
        table(times, "floor", "median ms", 1e3)
        for a, b in (("digest", "previous"), ("sha1", "digest")):
            ratio, low, high = ratio_of_medians(times[a], times[b])
            print(f"{a} / {b}: {ratio:.2f}x [{low:.2f}-{high:.2f}]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--watch", action="store_true", help="the watch's cost on training")
    parser.add_argument("--digest", action="store_true", help="the digest alone, in process")
    parser.add_argument("--size", type=int, default=100_000_000, help="--digest: elements")
    parser.add_argument("--device", default="cpu", help="--digest: where the tensors are")
    parser.add_argument("--threads", type=int, default=0, help="--digest: torch's CPU threads")
    args = parser.parse_args()
    if args.watch:
        return bench_watch(args.rounds)
    if args.digest:
        return bench_digest(args.rounds, args.size, args.device, args.threads)
    with distnb.start(2, progress=False) as s:
        s.run(SETUP.format(width=args.width, layers=args.layers))
        params = s.run("sum(p.numel() for p in model.parameters())").result(0)
        assert s.diff("model", grads=True).agree
        variants = {
            "floor": lambda: s.run(FLOOR),
            "distnb": lambda: s.diff("model", grads=True),
            "megatron": lambda: s.run(MEGATRON),
        }
        times = interleaved(variants, args.rounds)
    print(f"# {params} parameters + their gradients on 2 ranks, {args.rounds} rounds")
    table(times, "floor", "median s", 1.0)


if __name__ == "__main__":
    from results import saved

    mode = "watch" if "--watch" in sys.argv else "digest" if "--digest" in sys.argv else "diff"
    if mode == "digest" and "--threads" in sys.argv:
        mode += "-" + sys.argv[sys.argv.index("--threads") + 1] + "thread"
    if "--device" in sys.argv:
        mode += "-" + sys.argv[sys.argv.index("--device") + 1]
    with saved(f"replicas-{mode}"):
        main()
