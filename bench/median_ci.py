"""The confidence interval the benchmarks give each ratio: the median's, from order statistics."""

from __future__ import annotations


def median_ci(values: list[float]) -> tuple[float, float]:
    """A 95% confidence interval of the median, from order statistics (no assumption about the
    distribution): the values at ranks n/2 -/+ 0.98 sqrt(n), clamped to the sample."""
    v, n = sorted(values), len(values)
    half = 0.98 * n**0.5
    return v[max(0, int(n / 2 - half))], v[min(n - 1, int(n / 2 + half + 0.5))]


def ratio_of_medians(values: list[float], base: list[float]) -> tuple[float, float, float]:
    """median(values) / median(base), and its 95% interval: the 2.5th and 97.5th percentiles of
    the same ratio over 2,000 resamplings of the rounds (paired: a round keeps both its times),
    with a fixed seed so a rerun on the same times prints the same interval."""
    import random
    import statistics

    rounds = list(zip(values, base, strict=True))
    ratio = statistics.median(values) / statistics.median(base)
    rng = random.Random(0)
    samples = sorted(
        statistics.median(v for v, _ in pick) / statistics.median(b for _, b in pick)
        for pick in (rng.choices(rounds, k=len(rounds)) for _ in range(2000))
    )
    return ratio, samples[49], samples[1949]
