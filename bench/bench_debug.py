"""What the debugger on the ranks costs when no breakpoint is hit.

    python bench/bench_debug.py [--rounds 30] [--runs 10]

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
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from median_ci import ratio_of_medians
from results import saved

import distnb
from distnb.session.debugger.desk import Desk

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
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
