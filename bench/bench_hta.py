"""Who is slow and why, from one known-slow job: distnb's profile report against Holistic Trace
Analysis (HTA, Meta's `HolisticTraceAnalysis`), on the same CPU-only gloo job.

Run:  .venv/bin/python bench/bench_hta.py [--ranks N] [--hta-python PATH] [--traces DIR]
      .venv/bin/python bench/bench_hta.py --hta-only --traces DIR   (HTA on traces kept before)

The project does not depend on HTA. Its analyses run in an interpreter that imports `hta` (this
one if it does, else `--hta-python` or `$HTA_PYTHON`, e.g. a throwaway venv with
`pip install torch==2.13.0 HolisticTraceAnalysis`); with none, the bench says so and stops.

The job (`JOB`, as the slow-DataLoader test of `tests/session/test_profiling.py` has it): each
rank trains a small model over 20 batches from a DataLoader and all_reduces every gradient;
rank 1's Dataset sleeps 10 ms an item (40 ms a batch). In one distnb session of N ranks (gloo,
CPU) it runs twice:

- under `%dist_profile` then `%dist_profile --report` (`Session.profile`, then the report's
  parts as `profile_report` runs them): distnb's view, its verdict, and the kernel's time to
  collect and to analyse (the judgement and the view's text);
- under a plain `torch.profiler` on every rank, as HTA's documents ask: a schedule and
  `prof.step()` a step (so the trace has HTA's `ProfilerStep#N` marks), written per rank by
  `tensorboard_trace_handler` (torch's `export_chrome_trace`, with `distributedInfo`, its rank).

HTA then reads the traces' folder (`TraceAnalysis(trace_dir=...)`, timed) and runs, each timed
with its answer or its error in one line: `get_profiler_steps`, `get_temporal_breakdown`,
`get_idle_time_breakdown`, `get_comm_comp_overlap`, `get_potential_stragglers` and
`critical_path_analysis` (rank 0, the steps found).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SETUP = """
import time
from torch.utils.data import DataLoader, Dataset
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

class Slow(Dataset):
    def __len__(self):
        return 80
    def __getitem__(self, i):
        if rank == 1:
            time.sleep(0.01)
        return torch.randn(256)

def train(step=lambda: None):
    for x in DataLoader(Slow(), batch_size=4):
        model(x).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()
        step()
"""

JOB = "train()"

# HTA's form: ProfilerStep#N marks (a schedule and prof.step()), one trace file per rank
TRACED = """
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
with profile(
    activities=[ProfilerActivity.CPU],
    schedule=schedule(wait=0, warmup=0, active=20, repeat=1),
    on_trace_ready=tensorboard_trace_handler({folder!r}, worker_name=f"rank{{rank}}"),
) as prof:
    train(prof.step)
"""


def distnb_side(n: int, folder: str) -> dict[str, Any]:
    """The job under distnb's profile, then under torch.profiler for HTA's traces."""
    import distnb
    from distnb.rank import profiling, runtime
    from distnb.views.profiling import ProfileView

    with distnb.start(n, progress=False) as s:
        s.run(SETUP)
        s.run(JOB)  # warm: the first DataLoader and collectives
        s.profile()
        s.run(JOB)
        began = time.perf_counter()
        profiles = [p for p in s.call(profiling.collect) if p is not None]
        runs = [r for p in profiles for r in p.runs if r]
        events = [e for per in s.call(runtime.events, min(runs)) for e in per]
        collected = time.perf_counter() - began
        began = time.perf_counter()
        view = ProfileView(profiles, events)
        text = repr(view)
        analysed = time.perf_counter() - began
        s.run(TRACED.format(folder=folder))
    return {"collect_s": collected, "analyse_s": analysed, "text": text, "view": view}


HTA_SIDE = """
import json, sys, time, traceback
began = time.perf_counter()
import importlib.metadata
import hta
from hta.trace_analysis import TraceAnalysis
v = importlib.metadata.version
out = {"version": v("HolisticTraceAnalysis"),
       "libraries": ", ".join(f"{m} {v(m)}" for m in ("torch", "pandas", "numpy"))}
out["import_s"] = time.perf_counter() - began
began = time.perf_counter()
try:
    ta = TraceAnalysis(trace_dir=sys.argv[1])
except Exception as exc:
    out["load"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    print(json.dumps(out)); sys.exit(0)
out["load"] = {"s": time.perf_counter() - began, "ranks": sorted(ta.t.get_all_traces())}

def short(x):
    try:
        import pandas as pd
        if isinstance(x, pd.DataFrame):
            if x.empty:
                return f"an empty table (columns {list(x.columns)})"
            return x.round(3).to_string(max_rows=8, max_cols=8)
        if isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], bool):  # critical path
            graph, ok = x
            summary = graph.summary() if ok and hasattr(graph, "summary") else ""
            return f"succeeded={ok}" + (f": {short(summary)}" if ok else "")
    except Exception:
        pass
    return repr(x)[:600]

calls = [
    ("get_profiler_steps", lambda: ta.get_profiler_steps()),
    ("get_temporal_breakdown", lambda: ta.get_temporal_breakdown(visualize=False)),
    ("get_idle_time_breakdown", lambda: ta.get_idle_time_breakdown(visualize=False)),
    ("get_comm_comp_overlap", lambda: ta.get_comm_comp_overlap(visualize=False)),
    ("get_potential_stragglers", lambda: ta.get_potential_stragglers(num_candidates=1)),
    ("critical_path_analysis", lambda: ta.critical_path_analysis(
        rank=1, annotation="ProfilerStep", instance_id=5)),
]
for name, call in calls:
    began = time.perf_counter()
    try:
        got = {"answer": short(call())}
    except Exception as exc:
        got = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    got["s"] = time.perf_counter() - began
    out[name] = got

# what a reader can take from HTA's parsed traces by hand: each rank's steps (ProfilerStep#N),
# and its time per step in the DataLoader's __next__, in the op that leads the step's time
began = time.perf_counter()
names = ta.t.symbol_table.get_sym_table()
by_hand = {}
for r in sorted(ta.t.get_all_traces()):
    df = ta.t.get_trace(r)
    named = df.assign(label=[names[i] for i in df["name"]])
    steps = named[named["label"].str.startswith("ProfilerStep#")]
    loader = named[named["label"].str.startswith("enumerate(DataLoader)")]
    by_hand[r] = {
        "steps": len(steps),
        "step_ms": float(steps["dur"].median()) / 1e3,
        "loader_ms": float(loader["dur"].sum()) / 1e3 / max(1, len(steps)),
    }
out["by_hand"] = {"s": time.perf_counter() - began, "ranks": by_hand}
print(json.dumps(out))
"""


def hta_python(given: str) -> str | None:
    """An interpreter that imports `hta`: this one, `--hta-python` or `$HTA_PYTHON`."""
    for python in (sys.executable, given, os.environ.get("HTA_PYTHON", "")):
        if (
            python
            and subprocess.run([python, "-c", "import hta"], capture_output=True).returncode == 0
        ):
            return python
    return None


def hta_side(python: str, folder: str) -> dict[str, Any]:
    done = subprocess.run(
        [python, "-c", HTA_SIDE, folder], capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        return {"failed": done.stderr[-1500:]}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return dict(json.loads(lines[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--hta-python", default="", help="an interpreter that imports hta")
    parser.add_argument("--traces", default="", help="keep the per-rank traces in this folder")
    parser.add_argument(
        "--hta-only", action="store_true", help="only HTA's side, on the traces of --traces"
    )
    args = parser.parse_args()
    python = hta_python(args.hta_python)
    if python is None:
        print(
            "skipped: HTA is not importable (the project does not depend on it). Give an "
            "interpreter that has it: --hta-python PATH or HTA_PYTHON=PATH, e.g. a venv made "
            "with `pip install torch==2.13.0 HolisticTraceAnalysis`."
        )
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from results import saved

    if args.hta_only:
        report_hta(python, args.traces)
        return
    with saved("hta"), contextlib.ExitStack() as stack:
        folder = args.traces or stack.enter_context(
            tempfile.TemporaryDirectory(prefix="bench-hta-")
        )
        os.makedirs(folder, exist_ok=True)
        print(f"{args.ranks} ranks (gloo, CPU); rank 1's Dataset sleeps 10 ms an item; 20 steps")
        mine = distnb_side(args.ranks, folder)
        print("\ndistnb (%dist_profile, then %dist_profile --report):")
        print("  " + mine["text"].replace("\n", "\n  "))
        print(
            f"  collect {mine['collect_s'] * 1e3:.0f} ms, "
            f"analysis and text {mine['analyse_s'] * 1e3:.0f} ms"
        )
        report_hta(python, folder)


def report_hta(python: str, folder: str) -> None:
    files = sorted(f for f in os.listdir(folder) if f.endswith(".json"))
    sizes = sum(os.path.getsize(os.path.join(folder, f)) for f in files)
    info = [json.loads(Path(folder, f).read_text()).get("distributedInfo", {}) for f in files]
    print(
        f"\ntraces for HTA: {len(files)} files, {sizes / 1e6:.1f} MB; distributedInfo: "
        + ", ".join(
            f"rank {i.get('rank')} of {i.get('world_size')} ({i.get('backend')})" for i in info
        )
    )
    hta = hta_side(python, folder)
    if "failed" in hta:
        print(f"HTA failed:\n{hta['failed']}")
        return
    print(f"\nHTA {hta['version']} (import {hta['import_s']:.1f} s; {hta['libraries']}):")
    load = hta["load"]
    if "error" in load:
        print(f"  TraceAnalysis(trace_dir): {load['error']}")
        return
    print(f"  TraceAnalysis(trace_dir): {load['s']:.2f} s, ranks {load['ranks']}")
    for name, got in hta.items():
        if name in ("version", "libraries", "import_s", "load", "by_hand"):
            continue
        said = got.get("answer", got.get("error", ""))
        print(f"  {name} ({got['s']:.2f} s): " + said.replace("\n", "\n    "))
    hand = hta["by_hand"]
    print(f"  by hand, from HTA's parsed traces ({hand['s']:.2f} s): per rank, median ms")
    for r, row in hand["ranks"].items():
        print(
            f"    rank {r}: {row['steps']} ProfilerSteps of {row['step_ms']:.1f} ms, "
            f"DataLoader __next__ {row['loader_ms']:.1f} ms a step"
        )


if __name__ == "__main__":
    main()
