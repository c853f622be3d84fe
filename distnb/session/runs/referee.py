"""The kernel's referee: releases ranks that wait at a collective a peer will never reach.

A rank that waits longer than a few milliseconds at a checked collective writes its **beacon**
(`distnb.contract.keys.beacon(rank)`: the group, seq, op, call site and the ranks it waits for).
While a cell runs, the kernel looks at the beacons whenever a rank has finished, failed or died and
others
still run. If a running rank waits for one that is done, the kernel writes the run's abort key
(`ControlPlane.abort`) with the reason, and every waiter raises `CollectiveDesyncError` at once
instead of hanging until the process group's timeout.
"""

from __future__ import annotations

from collections.abc import Mapping

from distnb.judgement import cycle_reason, desync_reason, done_words, find_cycle, outside_reason
from distnb.records.beacon import Beacon
from distnb.records.cell import RankState
from distnb.session.control import ControlPlane
from distnb.session.runs.request import CellRequest

__all__ = ["DesyncReferee"]


class DesyncReferee:
    """Reads the beacons of a running cell through the session's control plane. `tick` runs on
    every wake of the cell's wait loop with the ranks' states so far; `waiters` keeps, per run
    id, the beacons of the ranks it released."""

    def __init__(self, control: ControlPlane):
        self.control = control
        self.waiters: dict[int, list[Beacon]] = {}
        self._released: set[int] = set()
        self._suspect: tuple[tuple[int, int], ...] = ()  # (rank, wait id) of a cycle seen once

    def tick(
        self, request: CellRequest, states: dict[int, RankState], failures: dict[int, str]
    ) -> None:
        run_id = request.run_id
        done = {r: s for r, s in states.items() if s is not RankState.RUNNING}
        running = [r for r, s in states.items() if s is RankState.RUNNING]
        if not running or run_id in self._released:
            return
        beacons = self.control.beacons(running)
        outside = [b for b in beacons if _waits_outside(b, run_id, states)]
        if outside:  # `--ranks`: a peer it waits for does not run this cell at all
            self.control.abort(run_id, outside_reason(outside, list(states), request.noun))
            self._released.add(run_id)
            self.waiters[run_id] = outside
            return
        waiters = [b for b in beacons if _waits_in(b, run_id, done)] if done else []
        if not waiters:  # no rank waits for one that is done: perhaps they wait in a circle
            self._look_for_cycle(run_id, beacons)
            return
        blamed = {r for b in waiters for r in b.waiting_for if r in done}
        words = {r: done_words(done[r], failures.get(r, "an error"), request.noun) for r in blamed}
        self.control.abort(run_id, desync_reason(words, waiters))
        self._released.add(run_id)
        self.waiters[run_id] = waiters

    def _look_for_cycle(self, run_id: int, beacons: list[Beacon]) -> None:
        if len(beacons) < 2:
            return
        cycle = find_cycle(beacons, run_id)
        seen = tuple((b.rank, b.wait_id) for b in cycle) if cycle else ()
        if not seen or seen != self._suspect:
            self._suspect = seen
            return
        assert cycle is not None
        self.control.abort(run_id, cycle_reason(cycle))
        self._released.add(run_id)
        self._suspect = ()


def _waits_outside(beacon: Beacon, run_id: int, states: Mapping[int, RankState]) -> bool:
    return (
        beacon.waiting
        and beacon.run_id == run_id
        and any(r not in states for r in beacon.waiting_for)
    )


def _waits_in(beacon: Beacon, run_id: int, done: Mapping[int, RankState]) -> bool:
    return beacon.waiting and beacon.run_id == run_id and any(r in done for r in beacon.waiting_for)
