"""Collective timelines as numbers: the pure half of the timeline view.

Input: `CollectiveEvent`s from every rank. Events of one collective share (group, seq).

Per collective:

- **last rank**: the rank with the greatest arrival time; the collective cannot start before it.
- **wait** of a rank: from its own arrival to the last arrival (`max(arrive_ns)`).
- **duration**: the time data moved, `end_ns - start_ns`, averaged over the ranks that know their
  end (nccl-tests averages its per-rank times the same way). Unknown while no rank has an end.

Bandwidth follows nccl-tests (`doc/PERFORMANCE.md`): `algbw = bytes / duration`,
`busbw = algbw * factor(n)` with n the group size. "bytes" is the size nccl-tests reports for the
op, derived here from `CollectiveEvent.nbytes`, read as **the bytes of the tensor(s) the rank
passes in** (the largest over the group's ranks, so a root's buffer counts for broadcast/scatter):

    op                               bytes (nccl-tests "size")          factor(n)
    all_reduce                       the buffer                         2(n-1)/n
    all_gather*, gather              n x the per-rank input (output)    (n-1)/n
    reduce_scatter*, scatter         the whole input (n x the output)   (n-1)/n
    all_to_all*                      the whole send buffer              (n-1)/n
    broadcast, reduce                the buffer                         1
    send, recv (and i-, batch)       the message                        1

Other ops (barrier, object collectives) get an algbw but no busbw. GB/s are 1e9 bytes/s.

**Stopped in a debugger** (`DebugStop`s, from `distnb.rank.debug.stops`): a rank stopped at a
prompt or in JupyterLab's debugger holds its peers up at their next collective. That part of a
wait (the overlap of the wait with the stops of the ranks that arrived later) is the user's
reading time, not a straggler's: it is counted apart (`stopped_wait_ns`) and left out of `wait`,
of "arrived last" and of the waits a rank caused; each rank's own time stopped is `stopped_ns`.

Clocks: one host shares one monotonic clock. Across hosts, pass per-rank offsets: a rank's time
plus its offset is the reference time (`ClockOffsets`); its `precision_ns` says how far the
aligned clocks can still be apart, and a rank only counts as a straggler when it arrived later
than the next rank by more than that.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from distnb.records.collective import CallSite, CollectiveEvent
from distnb.records.debug import DebugStop
from distnb.views.timeline.bandwidth import bus_factor, nccl_bytes

__all__ = [
    "ClockOffsets",
    "Collective",
    "OpStat",
    "RankSlot",
    "StragglerStat",
    "Timeline",
    "build_timeline",
    "bus_factor",
    "nccl_bytes",
]


class ClockSync(Protocol):
    """What `build_timeline` needs from the session's clock alignment."""

    @property
    def offsets_ns(self) -> Mapping[int, int]: ...

    @property
    def precision_ns(self) -> int: ...


@dataclass(frozen=True, slots=True)
class ClockOffsets:
    """Per-rank clock offsets: `time_on_rank + offsets_ns[rank]` is the reference time."""

    offsets_ns: Mapping[int, int] = field(default_factory=dict)
    precision_ns: int = 0

    def to_dict(self) -> dict[str, Any]:
        # JSON object keys are strings: ranks go out as "0", "1", ... and come back as ints.
        return {
            "offsets_ns": {str(r): o for r, o in self.offsets_ns.items()},
            "precision_ns": self.precision_ns,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ClockOffsets:
        offsets = {int(r): int(o) for r, o in d.get("offsets_ns", {}).items()}
        return cls(offsets, int(d.get("precision_ns", 0)))


@dataclass(frozen=True, slots=True)
class RankSlot:
    """One rank's part of a collective, on the reference clock (offsets applied)."""

    rank: int
    arrive_ns: int
    start_ns: int
    end_ns: int | None  # None: the rank never learned when the op finished
    wait_ns: int
    nbytes: int
    site: CallSite
    origin: str = ""  # the library code the call came through ("DDP gradient bucket 0 (...)")
    stopped_wait_ns: int = 0  # waited while a later rank sat stopped in a debugger


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective across the ranks that reported it (`slots`, in rank order)."""

    group: str
    seq: int
    op: str
    group_size: int
    slots: tuple[RankSlot, ...]
    last_rank: int
    lead_ns: int  # how much later the last rank arrived than the one before it
    nbytes: int  # nccl-tests "size" (see the module docstring)
    duration_ns: int | None
    first_arrive_ns: int
    last_arrive_ns: int
    end_ns: int  # the latest known end; the last arrival while none is known
    total_wait_ns: int
    stopped_wait_ns: int = 0  # the ranks' waits while a later rank sat stopped in a debugger

    @property
    def complete(self) -> bool:
        """Every member of the group reported it."""
        return len(self.slots) >= self.group_size

    @property
    def site(self) -> CallSite:
        """The last rank's call site: where the group was held up."""
        return next(s.site for s in self.slots if s.rank == self.last_rank)

    @property
    def algbw_gbps(self) -> float | None:
        if not self.duration_ns or self.duration_ns <= 0:
            return None
        return self.nbytes / self.duration_ns  # bytes/ns == GB/s

    @property
    def busbw_gbps(self) -> float | None:
        factor = bus_factor(self.op, self.group_size)
        algbw = self.algbw_gbps
        return None if algbw is None or factor is None else algbw * factor


@dataclass(frozen=True, slots=True)
class StragglerStat:
    """How often a rank arrived last, and the waiting that cost the others."""

    rank: int
    times_last: int
    wait_caused_ns: int
    own_wait_ns: int
    stopped_ns: int = 0  # the time this rank sat stopped in a debugger


@dataclass(frozen=True, slots=True)
class OpStat:
    """Totals per op. Bandwidths are byte-weighted: sum(bytes [x factor]) / sum(duration)."""

    op: str
    count: int
    nbytes: int
    timed: int  # collectives with a known duration; the bandwidths use only these
    time_ns: int
    wait_ns: int
    algbw_gbps: float | None
    busbw_gbps: float | None


@dataclass(frozen=True, slots=True)
class Timeline:
    """Everything the timeline views draw, on one clock."""

    collectives: tuple[Collective, ...]  # by first arrival
    ranks: tuple[int, ...]
    groups: tuple[str, ...]  # WORLD first, then in order of first use
    t0_ns: int
    t1_ns: int
    stragglers: tuple[StragglerStat, ...]  # most wait caused first
    ops: tuple[OpStat, ...]  # most time first
    offsets_applied: bool
    precision_ns: int | None
    hosts: Mapping[int, str] = field(default_factory=dict)  # rank -> host, when several
    stops: tuple[DebugStop, ...] = ()  # on the reference clock (offsets applied)

    @property
    def stopped_ns(self) -> int:
        """The time ranks sat stopped in a debugger, all ranks together."""
        return sum(s.end_ns - s.start_ns for s in self.stops)

    def who(self, rank: int) -> str:
        """`rank 1`, or `rank 1 (node2)` when the ranks span hosts."""
        return f"rank {rank}" + (f" ({self.hosts[rank]})" if rank in self.hosts else "")

    @property
    def n_events(self) -> int:
        return sum(len(c.slots) for c in self.collectives)

    @property
    def clock_note(self) -> str:
        if not self.offsets_applied:
            return "clocks: no offsets given; times compared as-is (right for ranks on one host)"
        return f"clocks: per-rank offsets applied, aligned to ±{_us(self.precision_ns or 0)}"


def build_timeline(
    events: Iterable[CollectiveEvent],
    offsets: ClockSync | Mapping[int, int] | None = None,
    hosts: Mapping[int, str] | None = None,
    stops: Iterable[DebugStop] = (),
) -> Timeline:
    """Group events by (group, seq), put them on one clock and summarise; time ranks sat
    stopped in a debugger (`stops`) is not waiting time.

    Example::

        tl = build_timeline(events, ClockOffsets({0: 0, 1: -41_000}, precision_ns=20_000))
        tl.stragglers[0].rank  # the rank that held the others up the most
    """
    shift, precision = _clock(offsets)
    shifted = tuple(
        DebugStop(
            s.rank, s.start_ns + shift.get(s.rank, 0), s.end_ns + shift.get(s.rank, 0), s.run_id
        )
        for s in sorted(stops, key=lambda s: (s.rank, s.start_ns))
    )
    by_rank: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for stop in shifted:
        by_rank[stop.rank].append((stop.start_ns, stop.end_ns))
    by_key: dict[tuple[str, int], list[CollectiveEvent]] = defaultdict(list)
    for e in events:
        by_key[(e.group, e.seq)].append(e)
    colls = sorted(
        (_collective(evs, shift, by_rank) for evs in by_key.values()),
        key=lambda c: (c.first_arrive_ns, c.group, c.seq),
    )
    ranks = sorted({s.rank for c in colls for s in c.slots})
    return Timeline(
        collectives=tuple(colls),
        ranks=tuple(ranks),
        groups=tuple(sorted(dict.fromkeys(c.group for c in colls), key=lambda g: g != "WORLD")),
        t0_ns=min((c.first_arrive_ns for c in colls), default=0),
        t1_ns=max((c.end_ns for c in colls), default=0),
        stragglers=_stragglers(colls, ranks, precision or 0, by_rank),
        ops=_op_stats(colls),
        offsets_applied=offsets is not None,
        precision_ns=precision,
        hosts=dict(hosts) if hosts and len(set(hosts.values())) > 1 else {},
        stops=shifted,
    )


def _clock(offsets: ClockSync | Mapping[int, int] | None) -> tuple[Mapping[int, int], int | None]:
    if offsets is None:
        return {}, None
    if isinstance(offsets, Mapping):
        return offsets, None
    return offsets.offsets_ns, offsets.precision_ns


def _collective(
    evs: Sequence[CollectiveEvent],
    shift: Mapping[int, int],
    stops: Mapping[int, Sequence[tuple[int, int]]],
) -> Collective:
    # One event per rank: a ring buffer pulled twice must not count a rank twice.
    evs = sorted({e.rank: e for e in evs}.values(), key=lambda e: e.rank)
    arrive = [e.arrive_ns + shift.get(e.rank, 0) for e in evs]
    last = max(arrive)
    # the part of each rank's wait during which a rank that came later sat in a debugger
    held = [
        _overlap(
            [span for j, e in enumerate(evs) if arrive[j] > a for span in stops.get(e.rank, ())],
            a,
            last,
        )
        for a in arrive
    ]
    slots = tuple(
        RankSlot(
            rank=e.rank,
            arrive_ns=a,
            # start_ns 0: data never moved (a peer never came); the bar starts at the arrival.
            start_ns=(e.start_ns or e.arrive_ns) + shift.get(e.rank, 0),
            end_ns=e.end_ns + shift.get(e.rank, 0) if e.end_ns else None,
            wait_ns=last - a - h,
            nbytes=e.nbytes,
            site=e.site,
            origin=e.origin,
            stopped_wait_ns=h,
        )
        for e, a, h in zip(evs, arrive, held, strict=True)
    )
    by_time = sorted(range(len(evs)), key=lambda i: (arrive[i], -evs[i].rank))
    last_i = by_time[-1]
    lead = arrive[last_i] - arrive[by_time[-2]] if len(evs) > 1 else 0
    if lead:  # arriving last because it sat in a debugger is not straggling
        lead -= _overlap(stops.get(evs[last_i].rank, ()), arrive[by_time[-2]], arrive[last_i])
    n = max(e.group_size for e in evs) or len(evs)
    op = evs[0].op
    if any(e.op != op for e in evs):
        # The checks stop ranks that disagree on the op; should some get through, name the
        # most common one.
        op = Counter(e.op for e in evs).most_common(1)[0][0]
    ends = [s.end_ns for s in slots if s.end_ns is not None]
    durations = [s.end_ns - s.start_ns for s in slots if s.end_ns is not None]
    return Collective(
        group=evs[0].group,
        seq=evs[0].seq,
        op=op,
        group_size=n,
        slots=slots,
        last_rank=evs[last_i].rank,
        lead_ns=lead,
        nbytes=nccl_bytes(op, max(e.nbytes for e in evs), n),
        duration_ns=max(0, sum(durations) // len(durations)) if durations else None,
        first_arrive_ns=min(arrive),
        last_arrive_ns=last,
        end_ns=max(ends, default=last),
        total_wait_ns=sum(s.wait_ns for s in slots),
        stopped_wait_ns=sum(held),
    )


def _overlap(spans: Iterable[tuple[int, int]], start: int, end: int) -> int:
    """How much of [start, end] the union of `spans` covers."""
    covered, reach = 0, start
    for a, b in sorted(spans):
        a, b = max(a, reach), min(b, end)
        if b > a:
            covered += b - a
            reach = b
    return covered


def _stragglers(
    colls: Sequence[Collective],
    ranks: Sequence[int],
    precision: int,
    stops: Mapping[int, Sequence[tuple[int, int]]],
) -> tuple[StragglerStat, ...]:
    last: Counter[int] = Counter()
    caused: Counter[int] = Counter()
    own: Counter[int] = Counter()
    for c in colls:
        for s in c.slots:
            own[s.rank] += s.wait_ns
        # Within the clocks' precision, nobody can be said to have arrived last.
        if len(c.slots) > 1 and c.lead_ns > precision:
            last[c.last_rank] += 1
            caused[c.last_rank] += c.total_wait_ns
    stopped = {r: sum(b - a for a, b in spans) for r, spans in stops.items()}
    stats = [StragglerStat(r, last[r], caused[r], own[r], stopped.get(r, 0)) for r in ranks]
    return tuple(sorted(stats, key=lambda s: (-s.wait_caused_ns, -s.times_last, s.rank)))


def _op_stats(colls: Sequence[Collective]) -> tuple[OpStat, ...]:
    by_op: dict[str, list[Collective]] = defaultdict(list)
    for c in colls:
        by_op[c.op].append(c)
    stats = (_op_stat(op, cs) for op, cs in by_op.items())
    return tuple(sorted(stats, key=lambda s: (-s.time_ns, -s.count, s.op)))


def _op_stat(op: str, cs: Sequence[Collective]) -> OpStat:
    timed = [c for c in cs if c.duration_ns]
    time_ns = sum(c.duration_ns or 0 for c in timed)
    bus = [bus_factor(c.op, c.group_size) for c in timed]
    return OpStat(
        op=op,
        count=len(cs),
        nbytes=sum(c.nbytes for c in cs),
        timed=len(timed),
        time_ns=time_ns,
        wait_ns=sum(c.total_wait_ns for c in cs),
        algbw_gbps=sum(c.nbytes for c in timed) / time_ns if time_ns else None,
        busbw_gbps=(
            sum(c.nbytes * f for c, f in zip(timed, bus, strict=True) if f is not None) / time_ns
            if time_ns and all(f is not None for f in bus)
            else None
        ),
    )


def _us(ns: int) -> str:
    return f"{ns / 1000:g} µs"
