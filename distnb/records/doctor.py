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

    @property
    def ok(self) -> bool:
        return not self.problems
