"""What an attached job's verdict costs at many ranks: its parts measured here, then fitted, for
the model of `bench_scale.py --part model`.

One verdict is `AttachedJob.status()` (what `%dist_attach` shows after attaching; `verdicts()`
asks the same): `snapshots()` asks every rank's agent for a `Status`, `events()` for its last
1,000 collectives (`Events(1000)`), each through `Link.ask`, and `distnb.judgement.snapshot`
judges what came back. Per ask, the notebook's client makes (`Link.ask` over the signed store,
`Signed` over `WireStore`), each a batch of one query per rank sent in one write whose answers
come in order: `add` (the requests' numbers: a round trip), `set` (the requests: sent, not
answered), `check` (which replies are there: a round trip, repeated while the agents answer),
`multi_get` (every reply there, read and verified in one request: a wait and a read, 2 round
trips) and `delete_key` (1): 5 requests per rank, 5 round trips in all, each reply read once
(the server still answers each request in turn). The rank's agent makes 5 requests more at the
same server (its wait's answer, a wait and a read of the request, its deletion, the reply). Every
record of a collective names its group's members (`OpenCall.members`,
`Fingerprint.group_ranks`); the codec writes them as runs of ranks (`codec.Ranks`), so a record
does not grow with the world, and records decoded from one reply share one tuple of members.

Measured here:

- `probe_job`: a real job of 2 ranks (`harness/train.py`, hung: rank 1 skipped an all_reduce,
  1,000 collectives recorded), attached; `status()` timed, its store requests and bytes counted
  on the wire client; one rank asked alone for a Status and for its Events (an agent's own
  time to answer: its thread's wake-up, a stack walk, the records made from its tape); its
  records kept as templates;
- `ask_costs`: `Link.ask` itself on replies posted beforehand (no agent in the timing), to a
  torch `TCPStore` server in a thread here: its time per rank and per reply byte;
- `codec_costs`: per rank, the bytes of a `Status` and an `Events` reply at N ranks, an agent's
  time to encode them (`to_dict` + `dumps_reply`, without building the fingerprints from its
  tape) and the notebook's to decode them (`loads_reply` + `from_dict`), on records made from
  the job's by their constructors (`dataclasses.replace`) for N ranks;
- `judgement_costs`: `snapshot.verdicts` on such records of N ranks with E collectives each,
  as `AttachedJob.verdicts` calls it (the members' tuple is one object shared by every record,
  as in records decoded from replies).
"""

from __future__ import annotations

import functools
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from distnb.judgement import snapshot
from distnb.records.agent import (
    Events,
    Recorded,
    Reply,
    Status,
    Taped,
    dumps_reply,
    loads_reply,
)
from distnb.records.attach import RankSnapshot

ASKED = 1000  # the collectives `AttachedJob.events()` asks each rank for
# round trips of each client call on the wire (`distnb.contract.storewire`): a `set` is not
# answered; `get` and `multi_get` wait for their keys first
TRIPS = {"add": 1, "set": 0, "check": 1, "multi_get": 2, "get": 2, "delete_key": 1, "wait": 1}
# `WireStore`'s batches: one query per key in one write (`Link.ask` sends every rank's at once)
BATCHES = {
    "add_each": "add",
    "set_each": "set",
    "present_each": "check",
    "delete_each": "delete_key",
}
PER_ASK = 5  # the notebook's requests per rank and per ask, when its reply is there at once
TRIPS_PER_ASK = 5  # the round trips of an ask, whatever the number of ranks (batches)
AGENT_REQUESTS = 5  # per rank and per ask, at the same server (see the module)
PROBE_RANKS = 2


class Counted:
    """A store client's queries counted by torch's names (a batch, `add_each`, as its queries),
    with the round trips they took and the bytes its reads returned and its writes sent."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.calls, self.read, self.sent = inner, dict[str, int](), 0, 0
        self.round_trips = 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)

        def counted(*args: Any) -> Any:
            query = BATCHES.get(name, name)
            many = len(args[0]) if name in BATCHES else 1
            self.calls[query] = self.calls.get(query, 0) + many
            self.round_trips += TRIPS.get(query, 1)  # a batch: one write, its answers in order
            if query == "set":
                self.sent += sum(len(v) for _, v in args[0]) if name in BATCHES else len(args[1])
            out = method(*args)
            if name == "get":
                self.read += len(out)
            elif name == "multi_get":
                self.read += sum(len(v) for v in out)
            return out

        return counted

    def trips(self) -> int:
        return self.round_trips


@dataclass
class Probe:
    """What `status()` did on the real job."""

    ranks: int
    seconds: float  # status(), median
    repeats: int
    calls: dict[str, int]
    trips: int
    read: int
    attach_calls: dict[str, int]
    verdicts: list[str]
    snaps: list[RankSnapshot]
    events: dict[int, list[Recorded]]
    answers: dict[str, float]  # one rank asked alone, by request: seconds, median


def counted(job: Any, call: Callable[[], Any]) -> Counted:
    """`call()` with `job`'s store client counted."""
    store = job.link.store
    seen = Counted(store._inner)
    store._inner = seen
    try:
        call()
    finally:
        store._inner = seen.inner
    return seen


def probe_job(repeats: int = 7, steps: int = 500) -> Probe:
    """A hung job of `PROBE_RANKS` ranks (rank 1 skipped all_reduce #7; `2 x steps` collectives
    recorded), attached: once its verdict holds, `status()` and one rank asked alone for a
    Status and for its Events timed `in_rounds`; one `status()` counted, and the attach's own
    reads of the agents' registrations."""
    import distnb
    from distnb.session.attach import _registered
    from harness.jobs import job, judged

    with (
        tempfile.TemporaryDirectory() as d,
        job(Path(d), "hang", n=PROBE_RANKS, STEPS=str(steps), SKIP_AT="3") as jb,
    ):
        jb.wait_for(r"final 1 ", timeout_s=600)
        j = distnb.attach(str(jb.folder), timeout=600)
        try:
            said = judged(j, lambda v: any("skipped" in x for x in v), 600)
            attach = counted(j, lambda: _registered(j.link, 10.0))
            seen = counted(j, j.status)
            cases: dict[Any, Callable[[], Any]] = {
                "verdict": j.status,
                "status": functools.partial(j.link.ask, [0], Status(), 30.0),
                "events": functools.partial(j.link.ask, [0], Events(ASKED), 30.0),
                "events, every rank": functools.partial(j.link.ask, j.ranks, Events(ASKED), 30.0),
            }
            answers = in_rounds(cases, repeats)
            snaps = j.snapshots()
            events = {r: [Recorded(e, f) for e, f in es] for r, es in j.events(ASKED).items()}
        finally:
            j.detach()
    return Probe(
        PROBE_RANKS,
        answers.pop("verdict"),
        repeats,
        seen.calls,
        seen.trips(),
        seen.read,
        attach.calls,
        said,
        snaps,
        events,
        answers,
    )


# --- records of N ranks, made from the job's ----------------------------------------------------


def ranks_records(
    probe: Probe, n: int, calls: int
) -> tuple[list[RankSnapshot], dict[int, list[Recorded]]]:
    """The job's hang at `n` ranks: rank 1 as the job's rank 1, every other rank as its rank 0
    (waiting for rank 1), each with its last `calls` collectives recorded."""
    members = tuple(range(n))
    snaps, events = [], {}
    for r in range(n):
        t = probe.snaps[1 if r == 1 else 0]
        cur = t.current
        if cur is not None:
            fp = cur.fingerprint
            fp = replace(fp, rank=r, group_ranks=members) if fp is not None else None
            cur = replace(cur, members=members, fingerprint=fp)
        last = replace(t.last, rank=r, group_size=n) if t.last is not None else None
        snaps.append(
            replace(t, rank=r, pid=t.pid + r, world_size=n, local_rank=r % 8, current=cur,
                    last=last)
        )  # fmt: skip
        events[r] = [
            Recorded(
                replace(x.event, rank=r, group_size=n),
                replace(x.fingerprint, rank=r, group_ranks=members),
            )
            for x in probe.events[1 if r == 1 else 0][-calls:]
        ]
    return snaps, events


def judge(snaps: Sequence[RankSnapshot], events: dict[int, list[Recorded]]) -> list[str]:
    """`AttachedJob.verdicts` on records already read."""
    return snapshot.verdicts(
        snaps,
        {r: [x.event for x in xs] for r, xs in events.items()},
        {r: [x.fingerprint for x in xs] for r, xs in events.items()},
    )


def in_rounds(cases: dict[Any, Callable[[], Any]], rounds: int) -> dict[Any, float]:
    """Each case's median seconds over `rounds` rounds, one call of every case a round, the
    order rotated and reversed from round to round (a busy machine's spells fall on all
    cases alike)."""
    names = list(cases)
    times: dict[Any, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        k = r % len(names)
        order = names[k:] + names[:k]
        for name in order if r // len(names) % 2 == 0 else order[::-1]:
            t = time.perf_counter()
            cases[name]()
            times[name].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def _median_s(repeats: int, call: Callable[..., Any], *args: Any) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        call(*args)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


# --- the store: Link.ask on replies posted beforehand --------------------------------------------


def ask_costs(rounds: int = 8) -> tuple[float, float, float, dict[int, float]]:
    """(per rank, per reply byte, an `add`'s round trip, {reply bytes: per rank}), seconds:
    `Link.ask(Status())` to K ranks whose replies (a JSON string) were posted before, from this
    process to a torch `TCPStore` server in a thread here, at (reply, K) = (1 KiB, 64) and
    (2 MiB, 4), the two in turn, medians over `rounds`: per rank, the first; per byte, the
    slope between them."""
    import socket

    import torch.distributed as dist

    from distnb.contract import keys
    from distnb.contract.folders import Endpoint
    from distnb.session.attach.link import Link

    server = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    e = Endpoint("scale", "127.0.0.1", server.port, socket.gethostname(), os.getpid(), 0.0)
    link = Link(e, secrets.token_hex(32))
    posts = link.twin()
    bodies = {k: dumps_reply(Reply("x" * size)) for size, k in ((1 << 10, 64), (1 << 21, 4))}
    groups = {k: [r + 1000 * k for r in range(k)] for k in bodies}

    def ask(k: int) -> None:
        ranks = groups[k]
        n = link.store.add(keys.agent_calls(ranks[0]), 0)
        for r in ranks:
            posts.store.set(keys.agent_reply(r, n), bodies[k])
        t = time.perf_counter()
        got = link.ask(ranks, Status(), 30.0)
        times[k].append((time.perf_counter() - t) / k)
        assert len(got) == k

    times: dict[int, list[float]] = {k: [] for k in bodies}
    try:
        for r in range(rounds):
            for k in list(bodies)[:: 1 if r % 2 == 0 else -1]:
                ask(k)
        add = _median_s(200, link.store.add, "scale-add", 1)
    finally:
        posts.close()
        link.close()
    per_rank = {len(bodies[k]): statistics.median(ts) for k, ts in times.items()}
    (small, t_small), (big, t_big) = per_rank.items()
    per_byte = (t_big - t_small) / (big - small)
    return t_small - small * per_byte, per_byte, add, per_rank


# --- what crosses the store, encoded and decoded ----------------------------------------------


@dataclass
class Codec:
    """One rank at N ranks: the bytes of its Status reply and of each recorded collective in its
    Events reply; an agent's seconds to encode them, the notebook's to decode them."""

    status_bytes: float
    event_bytes: float
    encode_status: float
    encode_event: float
    decode_status: float
    decode_event: float


def codec_costs(
    probe: Probe, sizes: Sequence[int], calls: int = 16, rounds: int = 9
) -> dict[int, Codec]:
    """Rank 0's replies (waiting in a collective of N members, `calls` recorded) at N in
    `sizes`: their bytes, and each way of each size timed `in_rounds`."""
    replies: dict[int, tuple[str, str]] = {}
    cases: dict[Any, Callable[[], Any]] = {}
    for n in sizes:
        snaps, events = ranks_records(probe, n, calls)
        snap, recs = snaps[0], events[0]
        status, told = _encode(snap), _encode(recs)
        replies[n] = (status, told)
        cases |= {
            (n, "encode status"): functools.partial(_encode, snap),
            (n, "encode events"): functools.partial(_encode, recs),
            (n, "decode status"): functools.partial(_decode_status, status),
            (n, "decode events"): functools.partial(_decode_events, told),
        }
    t = in_rounds(cases, rounds)
    return {
        n: Codec(
            len(status),
            len(told) / calls,
            t[(n, "encode status")],
            t[(n, "encode events")] / calls,
            t[(n, "decode status")],
            t[(n, "decode events")] / calls,
        )
        for n, (status, told) in replies.items()
    }


def _encode(value: RankSnapshot | list[Recorded]) -> str:
    """What an agent's serving thread does with what it answers (`Server.handle`)."""
    if isinstance(value, RankSnapshot):
        return dumps_reply(Reply(value.to_dict()))
    return dumps_reply(Reply(Taped(len(value), 0, tuple(value)).to_dict()))


def _decode_status(raw: str) -> RankSnapshot:
    """What the notebook does with a Status reply (`Link.ask`, `AttachedJob.snapshots`)."""
    return RankSnapshot.from_dict(loads_reply(raw).value)


def _decode_events(raw: str) -> list[Recorded]:
    """What the notebook does with an Events reply (`Link.ask`, `AttachedJob.events`)."""
    return list(Taped.from_dict(loads_reply(raw).value).records)


# --- the judgement ----------------------------------------------------------------------------


JUDGED = ((64, 16), (512, 16), (4096, 16), (64, 256), (512, 256))  # (ranks, calls each)


def judgement_costs(
    probe: Probe, points: Sequence[tuple[int, int]] = JUDGED, rounds: int = 4
) -> tuple[dict[tuple[int, int], float], tuple[float, float, float]]:
    """`judge` timed on N ranks with E collectives each, at (N, E) in `points` (`in_rounds`),
    and fitted as N (j0 + j1 E) + N^2 E j2: every rank's records read once, and every recorded
    collective's members compared (`matching`'s group rule: N fingerprints, whose N members are
    one shared tuple, compared by identity; j2 measures what is left of N x N)."""
    cases: dict[Any, Callable[[], Any]] = {}
    for n, e in points:
        snaps, events = ranks_records(probe, n, e)
        found = judge(snaps, events)
        assert any("rank 1 runs at" in v for v in found), found[:2]
        cases[(n, e)] = functools.partial(judge, snaps, events)
    times = in_rounds(cases, rounds)
    return times, _fit_judgement(times)


def _fit_judgement(times: dict[tuple[int, int], float]) -> tuple[float, float, float]:
    """Least squares (non-negative where a term would come out below 0) of t = N j0 + N E j1 +
    N^2 E j2, each point weighted by 1/t (relative errors)."""
    import numpy as np

    rows = [[n, n * e, n * n * e] for n, e in times]
    t = np.array(list(times.values()))
    a = np.array(rows, dtype=float) / t[:, None]
    fit = np.linalg.lstsq(a, np.ones(len(t)), rcond=None)[0]
    if (fit < 0).any():  # drop the terms that came out negative, fit the rest again
        keep = fit >= 0
        fit = np.zeros(3)
        fit[keep] = np.linalg.lstsq(a[:, keep], np.ones(len(t)), rcond=None)[0]
    return float(fit[0]), float(fit[1]), float(fit[2])


# --- the model ----------------------------------------------------------------------------------


@dataclass
class Verdict:
    """An attached verdict's seconds at n ranks with `calls` collectives recorded per rank."""

    requests: int
    bytes_per_rank: float
    store: float
    agents: float
    decode: float
    judgement: float

    @property
    def total(self) -> float:
        return self.store + self.agents + self.decode + self.judgement


@dataclass
class AttachModel:
    """The parts, and the verdict at N ranks with E calls recorded per rank (`verdict`), as the
    sum of: the store (2 asks of N ranks in turn, each rank's `Link.ask` time and its reply's
    bytes, and the agents' requests at the one server, as if none overlapped the notebook's);
    the agents (what the first rank's answer takes beyond the posting of the N requests, per
    ask); decoding N ranks' replies; and the judgement, as fitted."""

    probe: Probe
    per_rank: float  # Link.ask: seconds per rank, no reply bytes
    per_byte: float  # and per reply byte
    add: float  # an add's round trip: the time to post one rank's request
    asked: dict[int, float]  # Link.ask per rank, by reply bytes, as measured
    server: float  # the store server's own time per request (bench_scale's c)
    codec: dict[int, Codec]
    judged: dict[tuple[int, int], float]
    fit: tuple[float, float, float]

    def answering(self) -> tuple[float, float]:
        """An agent's own time to answer (its thread's wake-up, a stack walk, the records made
        from its tape), beyond encoding its reply, on the job: for a Status, and per recorded
        call for an Events; from one rank asked alone, less the notebook's part."""
        p, c = self.probe, self.codec[self.probe.ranks]
        calls = len(p.events[0])
        ours = self.per_rank + self.per_byte * c.status_bytes
        status = p.answers["status"] - ours - c.encode_status
        ours = self.per_rank + self.per_byte * c.event_bytes * calls
        events = p.answers["events"] - ours - c.encode_event * calls
        return max(0.0, status), max(0.0, events) / calls

    def verdict(self, n: int, calls: int) -> Verdict:
        c = self.codec[n]
        status, told = c.status_bytes, calls * c.event_bytes
        store = n * (2 * self.per_rank + 2 * AGENT_REQUESTS * self.server)
        store += n * (status + told) * self.per_byte
        # each agent answers while the server takes the requests of the ranks after it (an add
        # and a set each, in one batch): the rank asked first keeps the notebook waiting for
        # what its answer takes longer
        own_status, own_call = self.answering()
        answer_status = own_status + c.encode_status
        answer_events = calls * (own_call + c.encode_event)
        posting = 2 * n * self.server
        agents = sum(max(0.0, t - posting) for t in (answer_status, answer_events))
        decode = n * (c.decode_status + calls * c.decode_event)
        j0, j1, j2 = self.fit
        judgement = n * (j0 + j1 * calls) + n * n * calls * j2
        return Verdict(2 * n * PER_ASK, status + told, store, agents, decode, judgement)


def measure(server: float, sizes: Sequence[int]) -> AttachModel:
    """Every part, measured here (see the module); `server`: the store server's own time per
    request; `sizes`: the world sizes the model is asked about."""
    probe = probe_job()
    per_rank, per_byte, add, asked = ask_costs()
    codec = codec_costs(probe, sorted({probe.ranks, *sizes}))
    judged, fit = judgement_costs(probe)
    return AttachModel(probe, per_rank, per_byte, add, asked, server, codec, judged, fit)


def report(m: AttachModel, sizes: Sequence[int]) -> None:
    """The attached verdict's parts, printed for `sizes` ranks at 16 and `ASKED` calls."""
    p = m.probe
    asked = ", ".join(f"{k} {v}" for k, v in sorted(p.calls.items()))
    registered = sum(p.attach_calls.values())
    took = p.seconds
    print(
        f"# an attached job's verdict (status(), what %dist_attach shows): on a real job of "
        f"{p.ranks} ranks here (train.py, hung: rank 1 skipped all_reduce #7; "
        f"{len(p.events[0])} collectives recorded) it took {took * 1e3:.1f} ms (median of "
        f"{p.repeats}), with store requests {asked} ({p.trips} round trips; the checks "
        f"beyond {2 * p.ranks} are polls while the agents answer), "
        f"{p.read / p.ranks / 1e3:.0f} kB read per rank (each reply once); attaching read "
        f"each agent's registration too ({registered / p.ranks:.0f} requests per rank). "
        "Its verdict: " + " | ".join(p.verdicts)
    )
    here = m.verdict(p.ranks, len(p.events[0]))
    shown = ", ".join(f"{t * 1e6:.0f} us per rank at {b / 1e3:.0f} kB" for b, t in m.asked.items())
    print(
        f"# per rank and per ask, {PER_ASK} requests, in batches of every rank's "
        f"({TRIPS_PER_ASK} round trips an ask), and its reply read once; agents "
        f"{AGENT_REQUESTS} requests more at the server. Measured here: "
        f"Link.ask on replies posted before, {shown}: {m.per_rank * 1e6:.0f} us + "
        f"{m.per_byte * 1e9:.2f} ns per reply byte; an add's round trip {m.add * 1e6:.0f} us; "
        f"the server's time per request c = {m.server * 1e6:.1f} us"
    )
    own_status, own_call = m.answering()
    print(
        f"# an agent's own answer on the job (one rank asked alone: Status "
        f"{p.answers['status'] * 1e3:.1f} ms, Events({ASKED}) {p.answers['events'] * 1e3:.1f} "
        f"ms), less the notebook's part and the encoding: {own_status * 1e3:.1f} ms for a "
        f"Status, {own_call * 1e6:.0f} us per recorded call (parallel on every rank; what "
        "outlasts the posting of the requests to the ranks after it is waited for); both ranks "
        f"asked at once for their Events: {p.answers['events, every rank'] * 1e3:.1f} ms"
    )
    print("# one rank's replies at N ranks: bytes, an agent's encoding, the notebook's decoding")
    print(
        "#     N  Status B  per call B  encode Status us  per call us  decode Status us  "
        "per call us"
    )
    for n, c in m.codec.items():
        print(
            f"{n:7d}  {c.status_bytes:8.0f}  {c.event_bytes:10.0f}  {c.encode_status * 1e6:16.1f}"
            f"  {c.encode_event * 1e6:11.1f}  {c.decode_status * 1e6:16.1f}  "
            f"{c.decode_event * 1e6:11.1f}"
        )
    judged = ", ".join(f"{n}x{e} {t * 1e3:.0f} ms" for (n, e), t in m.judged.items())
    j0, j1, j2 = m.fit
    print(
        f"# judgement (snapshot.verdicts), ranks x calls recorded: {judged}; fitted as "
        f"N ({j0 * 1e6:.1f} us + {j1 * 1e6:.2f} us E) + N^2 E {j2 * 1e9:.2f} ns\n"
        f"# the model at the job's {p.ranks} ranks: {here.total * 1e3:.1f} ms against "
        f"{took * 1e3:.1f} ms measured (its agents' answers are one rank's asked alone, as on "
        "hosts where every rank has cores of its own; here both answer at once, on 2 busy "
        "cores)"
    )
    print(
        "# ranks  calls  requests  MB per rank    store s   agents s   decode s  judgement s"
        "  verdict s"
    )
    for recorded in (16, ASKED):
        for n in sizes:
            v = m.verdict(n, recorded)
            print(
                f"{n:7d}  {recorded:5d}  {v.requests:8d}  {v.bytes_per_rank / 1e6:11.3f}  "
                f"{v.store:9.2f}  {v.agents:9.2f}  {v.decode:9.2f}  {v.judgement:11.2f}  "
                f"{v.total:9.2f}"
            )


def main() -> None:
    """A trial of the parts alone (`bench_scale.py --part model` prints them with the
    collective's cost)."""
    sizes = (64, 256, 1024, 4096)
    report(measure(20e-6, sizes), sizes)


if __name__ == "__main__":
    main()
