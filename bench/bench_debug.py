"""What the debugger on the ranks costs when no breakpoint is hit, and how long one command
takes to answer on many stopped ranks.

    python bench/bench_debug.py [--rounds 30] [--runs 10]
    python bench/bench_debug.py --many 16 [--rounds 15]

Without `--many`: the cost when no breakpoint is hit.

The kernel's side of the debugger is its desk: while a cell runs, every wake of the wait loop
reads the control plane's prompt counter (one store round trip) to find ranks that ask for
input. The ranks' side is two cell hooks and a character count on their output streams. Three
variants run on one 2-rank cluster, interleaved in rounds:

- `no desk`: the same session with the desk's polling switched off in the kernel (the ranks'
  hooks stay: they cannot be told apart from the engine's own per-cell work);
- `desk`: as shipped;
- `no desk again`: the first variant once more, the control for the machine's noise.

Each round rotates the order of the variants, so none always runs first.

Workloads, each a `session.run` as `%%allranks` does it: an empty cell; a cell of 200 checked
8-element `all_reduce`s; a cell that sleeps 0.3 s (its wait loop wakes about 6 times). Each
round times `--runs` runs of each variant and keeps their median; the printed times are the
medians of those over rounds, and each ratio is the quotient of two printed times with its 95%
interval (paired bootstrap over rounds, `median_ci.ratio_of_medians`).

The visual debugger's cost after it was used: once JupyterLab's debugger has attached to the
ranks, each rank's debug adapter (`debugpy.listen`, started on the first attach) keeps
listening for the rest of the process's life. Three 2-rank sessions, in rounds whose order
rotates: `never attached`; `attached once` (the kernel's connection to every rank's adapter
made as the visual debugger makes it, `links.connect`, then disconnected and closed, before the
rounds); `never attached again`, a third session, the control. Workloads: 20 steps of a small
DDP MLP (forward, backward with its bucket all_reduce, SGD), and 200 checked all_reduces.

With `--many N`: every rank of an N-rank cluster stops at a `breakpoint()` (a training step's
breakpoint), and two ways to ask each rank the same thing take turns in each round (the order
alternates): `ranks all p x`, one command to every stopped rank with the answers grouped
(`distnb.session.debugger.many`); and the peer, `p x` at each rank's prompt one at a time,
switching with `rank N` (the only way before, and how a panel of one thread at a time works).
Time measured: from the moment an answer leaves the user's `input()` to the moment the next
prompt is asked, i.e. what the user waits for, summed over the one-at-a-time prompts; never the
typing. A script stands in for the kernel's `input()` (the desk asks through
`builtins.input`).
"""

from __future__ import annotations

import argparse
import builtins
import platform
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from median_ci import median_ci, ratio_of_medians
from results import saved

import distnb
from distnb.session.debugger.desk import Desk
from distnb.session.runs import run as runs

WORKLOADS = {
    "empty cell": "",
    "200 all_reduce (8 el)": ("x = torch.ones(8)\nfor _ in range(200):\n    dist.all_reduce(x)"),
    "cell of 0.3 s": "import time\ntime.sleep(0.3)",
}
VARIANTS = ("no desk", "desk", "no desk again")
SETUP = (
    "from torch.nn.parallel import DistributedDataParallel as DDP\n"
    "torch.manual_seed(0)\n"
    "model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),"
    " torch.nn.Linear(256, 64)))\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
    "data = torch.randn(32, 64)\n"
)
TRAINING = {
    "20 DDP steps (MLP)": (
        "for _ in range(20):\n"
        "    opt.zero_grad()\n"
        "    model(data).pow(2).mean().backward()\n"
        "    opt.step()\n"
    ),
    "200 all_reduce (8 el)": WORKLOADS["200 all_reduce (8 el)"],
}
SESSIONS = ("never attached", "attached once", "never attached again")


def timed(session: distnb.Session, code: str, runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        session.run(code)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


MANY_CELL = "x = torch.full((4,), float(rank))\nbreakpoint()\ny = 1"


class Script:
    """`input()` for the desk: answers from a list, stamping when each prompt was asked and when
    each answer was given."""

    def __init__(self, answers: list[str]) -> None:
        self.answers: Iterator[str] = iter(answers)
        self.asked: list[float] = []
        self.answered: list[float] = []

    def __call__(self, prompt: str = "") -> str:
        self.asked.append(time.perf_counter())
        line = next(self.answers)
        self.answered.append(time.perf_counter())
        return line

    def waited(self, k: int) -> float:
        """What the user waited after answer k for the next prompt."""
        return self.asked[k + 1] - self.answered[k]


def one_round(session: distnb.Session, n: int, many_first: bool) -> tuple[float, float]:
    """(all at once, one at a time) in seconds, for one cell where every rank stopped."""
    one_by_one = [a for r in range(n) for a in ([f"rank {r}"] if r else []) + ["p x"]]
    many = ["ranks all p x"]
    # first, unmeasured: every rank has reached its breakpoint (the command waits for that)
    answers = ["ranks all p 0"]
    answers += (many + one_by_one if many_first else one_by_one + many) + ["ranks all c"]
    script = Script(answers)
    builtins.input = script  # type: ignore[assignment]
    session.run(MANY_CELL)
    indices = [i for i, a in enumerate(answers) if a == "p x"]
    single = sum(script.waited(i) for i in indices)
    together = script.waited(answers.index("ranks all p x"))
    return together, single


def many(ranks: int, rounds: int) -> None:
    runs.frontend_stdin = lambda: True  # the script answers: as a frontend with stdin
    typed = builtins.input
    together, single = [], []
    try:
        with distnb.start(ranks, progress=False) as session:
            one_round(session, ranks, True)  # warm: pdb, imports
            for r in range(rounds):
                a, b = one_round(session, ranks, many_first=r % 2 == 0)
                together.append(a)
                single.append(b)
    finally:
        builtins.input = typed
    ratio, low, high = ratio_of_medians(together, single)
    print(f"# python {platform.python_version()}, {ranks} ranks, {rounds} rounds")
    for name, values in (("ranks all p x", together), ("p x at each prompt", single)):
        lo, hi = median_ci(values)
        ms = statistics.median(values) * 1e3
        print(f"{name:<20} {ms:8.1f} ms [{lo * 1e3:.1f}-{hi * 1e3:.1f}]")
    print(f"all at once / one at a time: {ratio:.3f}x [{low:.3f}-{high:.3f}]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--many", type=int, default=0, help="ranks stopped at once (e.g. 16)")
    args = parser.parse_args()
    if args.many:
        with saved("debug-many"):
            many(args.many, args.rounds)
        return
    with saved("debug"):
        desk(args.rounds, args.runs)
        visual(args.rounds, args.runs)


def attach_once(session: distnb.Session) -> None:
    """Connect to every rank's debug adapter as the visual debugger does (starting it), then
    disconnect: what is left is the adapter listening, for the process's life."""
    from distnb.session.debugger import links

    assert session.cluster is not None and session.control is not None
    for info in session.ranks:
        view = session.cluster.view(info.engine_id)
        client = links.connect(info, view, session.control, {}, lambda message: None)
        client.request("disconnect", {"terminateDebuggee": False}, timeout=30)
        client.close()
    listening = session.run("from distnb.rank.debug import visual\nvisual._address is not None")
    assert [listening.result(r) for r in (0, 1)] == ["True", "True"], "no adapter listens"


def visual(rounds: int, runs: int) -> None:
    """The visual debugger's adapter listening (attached once) against never attached."""
    sessions = {name: distnb.start(2, progress=False) for name in SESSIONS}
    try:
        for session in sessions.values():
            session.run(SETUP)
            for code in TRAINING.values():
                timed(session, code, 3)  # warm
        attach_once(sessions["attached once"])
        results: dict[tuple[str, str], list[float]] = {}
        for r in range(rounds):
            for name, code in TRAINING.items():
                k = r % len(SESSIONS)
                for variant in SESSIONS[k:] + SESSIONS[:k]:
                    t = timed(sessions[variant], code, runs)
                    results.setdefault((name, variant), []).append(t)
    finally:
        for session in sessions.values():
            session.stop()
    print(f"# visual debugger: {rounds} rounds x {runs} runs, a session each")
    print(
        f"{'workload':<24} {'never ms':>10} {'once ms':>9}  once/never [95% CI]      "
        "control (never again/never)"
    )
    for name in TRAINING:
        base, once, again = (results[(name, v)] for v in SESSIONS)
        ratio, low, high = ratio_of_medians(once, base)
        control, c_low, c_high = ratio_of_medians(again, base)
        print(
            f"{name:<24} {statistics.median(base) * 1e3:>10.2f} "
            f"{statistics.median(once) * 1e3:>9.2f}  "
            f"{ratio:.3f}x [{low:.3f}-{high:.3f}]   {control:.3f}x [{c_low:.3f}-{c_high:.3f}]"
        )


def desk(rounds: int, runs: int) -> None:
    serve = Desk.serve
    results: dict[tuple[str, str], list[float]] = {}
    with distnb.start(2, progress=False) as session:
        for code in WORKLOADS.values():
            timed(session, code, 3)  # warm: imports, first collectives
        for r in range(rounds):
            for name, code in WORKLOADS.items():
                for variant in VARIANTS[r % 3 :] + VARIANTS[: r % 3]:  # each goes first in turn
                    Desk.serve = serve if variant == "desk" else (lambda self, run: 0.0)  # type: ignore[method-assign]
                    results.setdefault((name, variant), []).append(timed(session, code, runs))
        Desk.serve = serve  # type: ignore[method-assign]
    print(f"# desk: {rounds} rounds x {runs} runs")
    print(f"{'workload':<24} {'no desk ms':>10} {'desk ms':>9}  desk/no desk [95% CI]   control")
    for name in WORKLOADS:
        base, served, again = (results[(name, v)] for v in VARIANTS)
        ratio, low, high = ratio_of_medians(served, base)
        control, c_low, c_high = ratio_of_medians(again, base)
        print(
            f"{name:<24} {statistics.median(base) * 1e3:>10.2f} "
            f"{statistics.median(served) * 1e3:>9.2f}  "
            f"{ratio:.3f}x [{low:.3f}-{high:.3f}]   {control:.3f}x [{c_low:.3f}-{c_high:.3f}]"
        )


if __name__ == "__main__":
    main()
