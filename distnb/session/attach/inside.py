"""Looking inside an attached job's stopped ranks, as inside distnb's own: code run in the
frames they are stopped in (`run`, `%%attached`), the shape table (`shapes`), replica digests
compared (`diff`), the overflow tracer (`overflow`, `overflow_report`). Functions of an
`AttachedJob`, bound to it as methods, kept here so that `job` holds attaching and driving.

Each one answers the open debugger prompt of every stopped rank asked at once (the agent's own
answers, `distnb.rank.agent.stopped`: `RUN` + code, `CALL` + a request) and waits for its next
prompt: the rank runs the request on its main thread, where the job's objects are not being
changed under it, and stays stopped. Records come back through the job's store
(`keys.agent_result`, under the number of the prompt answered) and are judged and shown by the
functions and views distnb uses for its own ranks.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from distnb import keys
from distnb.errors import ConfigError, SessionError
from distnb.records.debug import InputRequest

if TYPE_CHECKING:
    from distnb.session.attach.surface import JobSurface
    from distnb.views.overflow import OverflowView
    from distnb.views.replicas import ReplicaView
    from distnb.views.shapes import ShapeTableView

__all__ = ["call", "diff", "overflow", "overflow_report", "run", "shapes", "stopped"]

RUN = "\0run "  # the agent's own answers (distnb.rank.agent.stopped)
CALL = "\0call "


def stopped(
    job: JobSurface, ranks: Sequence[int] | None, wait_s: float = 30.0
) -> dict[int, InputRequest]:
    """The open prompt of each rank asked (default: every stopped rank); SessionError if one
    of them is not stopped."""
    asked = {r.rank: r for r in job.open_prompts(wait_s)}
    targets = [r for r in job.ranks if r in asked] if ranks is None else job.pick(ranks)
    missing = [r for r in targets if r not in asked]
    if not targets or missing:
        who = f"rank {', '.join(map(str, missing))} is not" if missing else "no rank is"
        raise SessionError(
            f"{who} stopped: stop ranks first (job.stop(), %dist_attach --stop), then wait "
            "for them to reach their next collective"
        )
    return {r: asked[r] for r in targets}


def answer_all(
    job: JobSurface, asked: dict[int, InputRequest], line: Callable[[InputRequest], str],
    timeout_s: float = 30.0,
) -> dict[int, str]:  # fmt: skip
    """Answer each prompt with `line(prompt)` and wait for each rank's next prompt; what each
    rank printed meanwhile (what it printed before is shown first, with `[rank N]`)."""
    prompts, deadline = job.prompts, time.monotonic() + timeout_s
    for rank, request in asked.items():
        while prompts.written(rank)[0] < request.stdout and time.monotonic() < deadline:
            time.sleep(0.005)
        show({rank: prompts.take(rank)})
        prompts.answer(request.n, line(request))
    out = {}
    for rank in asked:
        while rank not in {r.rank for r in prompts.asks()}:
            if time.monotonic() > deadline:
                raise SessionError(f"rank {rank} did not finish in {timeout_s:g} s")
            time.sleep(0.01)
        request = prompts.open[rank]
        while prompts.written(rank)[0] < request.stdout and time.monotonic() < deadline:
            time.sleep(0.005)
        out[rank] = prompts.take(rank)
    return out


def run(
    job: JobSurface, code: str, ranks: Sequence[int] | None = None, timeout_s: float = 30.0
) -> dict[int, str]:
    """Run `code` in the frame each stopped rank is stopped in; its output, by rank (printed
    with `[rank N]` too). The last expression's value is shown, as in a cell."""
    out = answer_all(job, stopped(job, ranks, timeout_s), lambda _: RUN + code, timeout_s)
    show(out)
    return out


def call(
    job: JobSurface, request: dict[str, Any], ranks: Sequence[int] | None = None,
    timeout_s: float = 60.0,
) -> dict[int, Any]:  # fmt: skip
    """Each stopped rank's answer to `request` over its frame (`distnb.rank.agent.frames`)."""
    asked = stopped(job, ranks, timeout_s)
    answer_all(job, asked, lambda q: CALL + json.dumps({**request, "reply": q.n}), timeout_s)
    store, replies = job.link.store, {}
    for rank, request_ in asked.items():
        key = keys.agent_result(rank, request_.n)
        replies[rank] = json.loads(store.get(key))
        store.delete_key(key)
    errors = {r: reply["error"] for r, reply in replies.items() if "error" in reply}
    if errors:
        ranks_ = ", ".join(map(str, sorted(errors)))
        raise ConfigError(f"rank {ranks_}: {next(iter(errors.values()))}")
    return {r: reply["ok"] for r, reply in replies.items()}


def shapes(
    job: JobSurface, names: Sequence[str] | None = None, all: bool = False,
    ranks: Sequence[int] | None = None,
) -> ShapeTableView:  # fmt: skip
    """The shape table of the stopped ranks' frames (what `%dist_shapes` shows), differences
    first: their tensors and modules, metadata only."""
    from distnb.records.shapes import ShapeScan
    from distnb.views.shapes import ShapeTableView

    found = call(job, {"fn": "shapes", "names": list(names or []), "all": all}, ranks)
    return ShapeTableView.from_scans([ShapeScan.from_dict(found[r]) for r in sorted(found)])


def diff(
    job: JobSurface, *names: str, grads: bool = False, buffers: bool = False,
    expect: str = "same", ranks: Sequence[int] | None = None,
) -> ReplicaView:  # fmt: skip
    """Do the stopped ranks' replicas agree (what `%dist_diff` shows)? The modules, tensors
    and optimizers `names` the frames see, digested on each rank and compared bit for bit;
    the differences are named, not sized (sizing moves tensors: `run` code for that)."""
    from distnb.records.replicas import Digest, ReplicaReport, bad_options, compare
    from distnb.views.replicas import ReplicaView

    if not names:
        raise ConfigError("name what to compare, e.g. job.diff('model', 'opt')")
    if bad := bad_options(0.0, expect):
        raise ConfigError(bad)
    request = {"fn": "digests", "names": list(names), "grads": grads, "buffers": buffers}
    found = call(job, request, ranks)
    digests = [Digest.from_dict(d) for r in sorted(found) for d in found[r]]
    members = sorted(found)
    differences, missing, compared, alone = compare(digests, members, expect)
    report = ReplicaReport(
        tuple(names), tuple(members), compared, sum(d.nbytes for d in digests),
        tuple(differences), tuple(missing), alone, expect,
    )  # fmt: skip
    return ReplicaView(report)


def overflow(
    job: JobSurface, name: str, ranks: Sequence[int] | None = None, **options: Any
) -> None:
    """Trace overflow on the module the stopped frames call `name` from now on (the options
    of `distnb.overflow.watch`); it sees the ranks' next steps once they go on. `detach`
    removes it."""
    from distnb.records.overflow import WatchOptions

    try:
        record = WatchOptions.of(**options)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    call(job, {"fn": "overflow", "name": name, "options": record.to_dict()}, ranks)


def overflow_report(job: JobSurface, ranks: Sequence[int] | None = None) -> dict[str, OverflowView]:
    """Each traced module's frames per stopped rank, and which rank went non-finite first."""
    from distnb.records.overflow import RankOverflowReport
    from distnb.views.overflow import OverflowView

    found = call(job, {"fn": "overflow_report"}, ranks)
    names = sorted({n for reports in found.values() for n in reports})
    return {
        n: OverflowView([RankOverflowReport.from_dict(r[n]) for r in found.values() if n in r])
        for n in names
    }


def show(out: dict[int, str]) -> None:
    for rank, text in out.items():
        for line in text.rstrip("\n").split("\n") if text else []:
            print(f"[rank {rank}] {line}")
