"""Looking inside an attached job's stopped ranks, as inside distnb's own: code run in the
frames they are stopped in (`run`, `%%attached`), the shape table (`shapes`), replica digests
compared (`diff`), the overflow tracer (`overflow`, `overflow_report`). Functions of an
`AttachedJob`, bound to it as methods, kept here so that `job` holds attaching and driving.

Each one answers the open debugger prompt of every stopped rank asked at once (the notebook's
own answers, `distnb.records.agent`: `Execute` code, `Call` a `FrameQuery`) and waits for its next
prompt: the rank runs the request on its main thread, where the job's objects are not being
changed under it, and stays stopped. Records come back through the job's store
(`keys.agent_result`, under the number of the prompt answered) and are judged and shown by the
functions and views distnb uses for its own ranks.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from distnb.contract import keys
from distnb.errors import ConfigError, SessionError
from distnb.records.agent import (
    Call,
    Digests,
    Execute,
    FrameQuery,
    Pull,
    Push,
    Shapes,
    Watch,
    WatchReport,
    answer_line,
    loads_reply,
)
from distnb.records.debug import InputRequest

if TYPE_CHECKING:
    from distnb.ranklist import RankArg
    from distnb.session.attach.surface import JobSurface
    from distnb.views.overflow import OverflowView
    from distnb.views.replicas import ReplicaView
    from distnb.views.shapes import ShapeTableView

__all__ = [
    "call",
    "diff",
    "overflow",
    "overflow_report",
    "pull",
    "push",
    "run",
    "shapes",
    "stopped",
]


def stopped(
    job: JobSurface, ranks: RankArg | None, wait_s: float = 30.0
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
    job: JobSurface,
    asked: dict[int, InputRequest],
    line: Callable[[InputRequest], str],
    timeout_s: float = 30.0,
) -> dict[int, str]:
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
    job: JobSurface, code: str, ranks: RankArg | None = None, timeout_s: float = 30.0
) -> dict[int, str]:
    """Execute `code` in the frame each stopped rank is stopped in; its output, by rank (printed
    with `[rank N]` too). The last expression's value is shown, as in a cell."""
    line = answer_line(Execute(code))
    out = answer_all(job, stopped(job, ranks, timeout_s), lambda _: line, timeout_s)
    show(out)
    return out


def call(
    job: JobSurface,
    query: FrameQuery,
    ranks: RankArg | None = None,
    timeout_s: float = 60.0,
) -> dict[int, Any]:
    """Each stopped rank's answer to `query` over its frame (`distnb.rank.agent.frames`)."""
    asked = stopped(job, ranks, timeout_s)
    answer_all(job, asked, lambda q: answer_line(Call(query, q.n)), timeout_s)
    store, replies = job.link.store, {}
    for rank, request in asked.items():
        key = keys.agent_result(rank, request.n)
        replies[rank] = loads_reply(store.get(key))
        store.delete_key(key)
    errors = {r: reply.error for r, reply in replies.items() if reply.error is not None}
    if errors:
        ranks_ = ", ".join(map(str, sorted(errors)))
        raise ConfigError(f"rank {ranks_}: {next(iter(errors.values()))}")
    return {r: reply.value for r, reply in replies.items()}


def shapes(
    job: JobSurface,
    names: Sequence[str] | None = None,
    all: bool = False,
    ranks: RankArg | None = None,
) -> ShapeTableView:
    """The shape table of the stopped ranks' frames (what `%dist_shapes` shows), differences
    first: their tensors and modules, metadata only."""
    from distnb.records.shapes import ShapeScan
    from distnb.views.shapes import ShapeTableView

    found = call(job, Shapes(tuple(names or ()), include_all=all), ranks)
    return ShapeTableView.from_scans([ShapeScan.from_dict(found[r]) for r in sorted(found)])


def diff(
    job: JobSurface,
    *names: str,
    grads: bool = False,
    buffers: bool = False,
    atol: float = 0.0,
    expect: str = "same",
    ranks: RankArg | None = None,
) -> ReplicaView:
    """Do the stopped ranks' replicas agree (what `%dist_diff` shows)? The modules, tensors
    and optimizers `names` the frames see, digested on each rank and compared bit for bit;
    the differences are named, not sized (sizing moves tensors: `run` code for that)."""
    from distnb.records.replicas import Digest, ReplicaReport, bad_options, compare
    from distnb.views.replicas import ReplicaView

    if not names:
        raise ConfigError("name what to compare, e.g. job.diff('model', 'opt')")
    if atol:
        raise ConfigError(
            "an attached job's replicas are compared bit for bit (a tolerance needs the "
            "differences sized, which moves tensors): drop --atol, or size them with %%attached"
        )
    if bad := bad_options(0.0, expect):
        raise ConfigError(bad)
    found = call(job, Digests(names, grads, buffers), ranks)
    digests = [Digest.from_dict(d) for r in sorted(found) for d in found[r]]
    members = sorted(found)
    differences, missing, compared, alone = compare(digests, members, expect)
    report = ReplicaReport(
        tuple(names),
        tuple(members),
        compared,
        sum(d.nbytes for d in digests),
        tuple(differences),
        tuple(missing),
        alone,
        expect,
    )
    return ReplicaView(report)


def overflow(job: JobSurface, name: str, ranks: RankArg | None = None, **options: Any) -> None:
    """Trace overflow on the module the stopped frames call `name` from now on (the options
    of `distnb.overflow.watch`); it sees the ranks' next steps once they go on. `detach`
    removes it."""
    from distnb.records.overflow import WatchOptions

    try:
        record = WatchOptions.of(**options)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    call(job, Watch(name, record), ranks)


def overflow_report(job: JobSurface, ranks: RankArg | None = None) -> dict[str, OverflowView]:
    """Each traced module's frames per stopped rank, and which rank went non-finite first."""
    from distnb.records.overflow import RankOverflowReport
    from distnb.views.overflow import OverflowView

    found = call(job, WatchReport(), ranks)
    names = sorted({n for reports in found.values() for n in reports})
    return {
        n: OverflowView([RankOverflowReport.from_dict(r[n]) for r in found.values() if n in r])
        for n in names
    }


def show(out: dict[int, str]) -> None:
    for rank, text in out.items():
        for line in text.rstrip("\n").split("\n") if text else []:
            print(f"[rank {rank}] {line}")


def pull(
    job: JobSurface, name: str, ranks: RankArg | None = None, limit: int | None = None
) -> list[Any]:
    """Each stopped rank's `name` (a name or dotted path its frame sees), in rank order,
    tensors on the CPU (what `%dist_pull` binds); refusals as `Session.pull` words them."""
    from distnb.records.transfer import Refusal
    from distnb.session.data import check_pull, received

    limit = check_pull(name, limit)
    found = call(job, Pull(name, limit), ranks)

    def answer(value: Any) -> tuple[str, bytes] | Refusal:
        if isinstance(value, dict):
            return Refusal.from_dict(value)
        what, data = value
        return what, base64.b64decode(data)

    return received(name, limit, ((r, answer(found[r])) for r in sorted(found)))


def push(
    job: JobSurface, ranks: RankArg | None = None, limit: int | None = None, **values: Any
) -> None:
    """Bind each keyword's value to its name in every stopped rank's frame (`%dist_push`)."""
    from distnb.session.data import check_push, pickled

    limit = check_push(values, limit)
    data = [base64.b64encode(pickled(n, v, limit)).decode() for n, v in values.items()]
    call(job, Push(tuple(values), tuple(data)), ranks)
