"""`distnb demo`: the main job without Jupyter: two CPU ranks and what distnb reports."""

from __future__ import annotations

import textwrap
from pathlib import Path

import distnb
from distnb.errors import RankError


def story(title: str, code: str) -> None:
    print(f"\n=== {title}\n" + textwrap.indent(code.strip(), "  | "))


def show(err: RankError) -> None:
    print("\n".join(err._render_traceback_()))


def run_demo(out: str) -> int:
    Path(out).mkdir(parents=True, exist_ok=True)
    print("distnb demo: starting 2 CPU ranks (gloo)")
    with distnb.start(2, backend="gloo", progress=False) as s:
        print(s.status())
        code = "x = torch.ones(3) * rank\ndist.all_reduce(x)\nprint(rank, x)"
        story("%%allranks: every rank's output, labelled, in rank order", code)
        s.run(code)

        code = "if rank == 1:\n    raise ValueError(f'bad batch on rank {rank}')"
        story("An error on one rank is raised in the notebook with that rank's cell line", code)
        try:
            s.run(code)
        except RankError as err:
            show(err)

        code = "import time\nif rank == 1:\n    time.sleep(600)  # a stuck rank"
        story("A stuck rank: the cell's timeout gives a hang report, not a frozen notebook", code)
        try:
            s.run(code, timeout=2)
        except RankError as err:
            show(err)
        s.run("print('the cluster still works after the hang:', rank)")
    print("\ndistnb demo: done; every process stopped")
    return 0
