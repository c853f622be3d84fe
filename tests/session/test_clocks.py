"""Clock offsets between ranks and the kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from distnb.session import inspection
from distnb.session.clocks import estimate_offsets, offset_from

if TYPE_CHECKING:
    from distnb.session import Session


def test_offset_is_the_midpoint_and_precision_half_the_round_trip() -> None:
    # kernel sent at 1000, rank read 5500 on its clock, answer back at 1200
    assert offset_from(1000, 5500, 1200) == (1100 - 5500, 100)


@pytest.mark.cluster
def test_ranks_on_this_host_share_the_kernels_clock(session: Session) -> None:
    ranks = [r.rank for r in session.ranks]
    clocks = estimate_offsets(session.call, ranks)
    assert set(clocks.offsets_ns) == set(ranks)
    for offset in clocks.offsets_ns.values():
        assert abs(offset) <= clocks.precision_ns  # one monotonic clock: 0 within precision
    assert inspection._clock_offsets(session) is None  # one host: none needed
