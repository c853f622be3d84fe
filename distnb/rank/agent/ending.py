"""How a rank's process ended, left in the run folder as it ends (`RunFolder.write_final`).

A rank that ends while its peers wait for it, or a job that ends while the notebook looks at it,
takes its control plane's answers with it. So each rank's agent writes its last snapshot when
its process ends (`atexit`): the collective it was in, the last it finished, how many it entered
per group, and how it ended in `where`: "finished its script", or "raised RuntimeError:
Connection closed by peer [127.0.0.1]:63911 at train.py:59" (from `sys.excepthook`, which the
interpreter calls before it ends on an uncaught exception). The notebook reads these for the
verdict on an ending (`distnb.judgement.snapshot.endings`). A rank killed by a signal writes
nothing: its silence is the evidence.
"""

from __future__ import annotations

import atexit
import contextlib
import re
import sys
import traceback
from collections.abc import Callable
from dataclasses import replace
from types import TracebackType
from typing import Any

from distnb.contract.folders import RunFolder
from distnb.rank.agent.serve import users_frames
from distnb.records.attach import AgentState, OpenCall, RankSnapshot

__all__ = ["install"]

_COLLECTIVES = "torch/distributed/distributed_c10d.py"  # an error raised in a collective
_LOCATION = re.compile(r"^\[[^\]]*\]\s*")  # gloo's and NCCL's `[file.cc:553] ` before a message


def install(rank: int, folder: RunFolder, snapshot: Callable[[], RankSnapshot]) -> None:
    """Write rank `rank`'s last `snapshot()` into `folder` as its process ends (see the module)."""
    raised: list[tuple[str, tuple[Any, ...], bool]] = []
    before = sys.excepthook

    def hook(etype: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        every = traceback.extract_tb(tb)
        frames = users_frames(every)
        inside = any(f.filename.endswith(_COLLECTIVES) for f in every)
        raised.append((raised_words(etype, value, frames), frames, inside))
        before(etype, value, tb)

    def write() -> None:
        try:
            last = snapshot()
        except Exception:  # the agent's state is gone with the interpreter: nothing to say
            return
        how, frames, inside = raised[-1] if raised else ("finished its script", (), False)
        final = replace(last, state=AgentState.GONE, stack=frames, where=how)
        e = final.last
        if inside and final.current is None and e is not None:  # its failed call counts as done
            final = replace(final, current=OpenCall(e.group, "", e.seq, e.op, (), e.site))
        with contextlib.suppress(OSError):  # a run folder this host cannot write: less is said
            folder.write_final(rank, final)

    sys.excepthook = hook
    atexit.register(write)


def raised_words(etype: type[BaseException], value: BaseException, frames: Any) -> str:
    """`raised RuntimeError: Connection closed by peer [127.0.0.1]:63911 at train.py:59`: the
    exception's first sentence, without the backend's source location, at the user's line."""
    text = _LOCATION.sub("", str(value).strip().splitlines()[0] if str(value).strip() else "")
    first = text.split(". ")[0].rstrip(".")
    said = f"raised {etype.__name__}: {first}" if first else f"raised {etype.__name__}"
    top = frames[-1] if frames else None
    return f"{said} at {top.file}:{top.line}" if top is not None else said
