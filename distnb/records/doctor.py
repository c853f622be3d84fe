"""What `distnb doctor` learns from each rank."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Bandwidth:
    """One all_reduce size: median time and nccl-tests' bus bandwidth (2(n-1)/n x bytes / time)."""

    nbytes: int
    seconds: float
    busbw_gbps: float


@dataclass(frozen=True, slots=True)
class DoctorReport:
    rank: int
    host: str
    pid: int
    device: str
    backend: str
    versions: tuple[tuple[str, str], ...]
    problems: tuple[str, ...]
    bandwidth: tuple[Bandwidth, ...]
    torch_range: str = ""  # where this rank's torch lies against the tested range, in words
    torch_gaps: tuple[str, ...] = ()  # what distnb cannot check with this torch, one line each

    @property
    def ok(self) -> bool:
        return not self.problems
