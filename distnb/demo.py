"""`distnb demo`: the main job without Jupyter: two CPU ranks and what distnb reports."""

from __future__ import annotations

import textwrap
from pathlib import Path

import distnb
from distnb.errors import RankError
from distnb.session import Session

STORIES = [
    (
        "%%allranks: every rank's output, labelled, in rank order",
        "x = torch.ones(3) * rank\ndist.all_reduce(x)\nprint(rank, x)",
    ),
    (
        "A shape mismatch (Accelerate's broadcast example): plain gloo would abort rank 1 or\n"
        "hand it a half-written tensor; distnb stops every rank before data moves",
        "x = torch.zeros(1, 5) if rank == 0 else torch.zeros(1, 2, 5)\ndist.broadcast(x, src=0)",
    ),
    (
        "The early-stopping bug: rank 1 leaves the loop alone; plain gloo hangs for 30 minutes,\n"
        "distnb releases rank 0 as soon as rank 1 finishes",
        "for step in range(4):\n"
        "    loss = torch.tensor([1.0])\n"
        "    if rank == 1 and step == 2:\n"
        "        break\n"
        "    dist.all_reduce(loss)",
    ),
    (
        "A skipped collective: rank 1 skips an all_reduce and calls the next one",
        "x = torch.ones(2)\nif rank == 0:\n    dist.all_reduce(x)\ndist.all_reduce(x)",
    ),
    (
        "A stuck rank: the cell's timeout gives a hang report, not a frozen notebook",
        "import time\nif rank == 1:\n    time.sleep(600)  # a stuck rank\ndist.barrier()",
    ),
]

STRAGGLER = (
    "import time\n"
    "x = torch.ones(1024)\n"
    "for step in range(8):\n"
    "    if rank == 1:\n"
    "        time.sleep(0.02)  # rank 1 is slow: everybody else waits for it\n"
    "    dist.all_reduce(x)"
)


def run_demo(out: str) -> int:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    print("distnb demo: starting 2 CPU ranks (gloo)")
    with distnb.start(2, backend="gloo", progress=False) as s:
        print(s.status())
        for title, code in STORIES:
            _story(s, title, code)
        _timeline(s, folder)
    print("\ndistnb demo: done; every process stopped")
    return 0


def _story(s: Session, title: str, code: str) -> None:
    print(f"\n=== {title}\n" + textwrap.indent(code, "  | "))
    try:
        s.run(code, timeout=3)
    except RankError as err:
        print("\n".join(err._render_traceback_()))


def _timeline(s: Session, folder: Path) -> None:
    print("\n=== A straggler: the collective timeline says who waited for whom\n")
    print(textwrap.indent(STRAGGLER, "  | "))
    s.run(STRAGGLER)
    view = s.timeline(cells=1)
    print(view)
    view.savefig(folder / "timeline.png")
    view.export_chrome_trace(folder / "timeline.json")
    print(f"\nwrote {folder / 'timeline.png'} and {folder / 'timeline.json'} (open it in Perfetto)")
