"""The confidence interval the benchmarks give each ratio: the median's, from order statistics."""

from __future__ import annotations


def median_ci(values: list[float]) -> tuple[float, float]:
    """A 95% confidence interval of the median, from order statistics (no assumption about the
    distribution): the values at ranks n/2 -/+ 0.98 sqrt(n), clamped to the sample."""
    v, n = sorted(values), len(values)
    half = 0.98 * n**0.5
    return v[max(0, int(n / 2 - half))], v[min(n - 1, int(n / 2 + half + 0.5))]
