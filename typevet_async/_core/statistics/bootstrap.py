"""Bootstrap percentile intervals of evaluation metrics, computed from resample counts.

An interval: ``resamples`` resamples of the n items with replacement
(``numpy.random.default_rng(seed)``), every scalar metric recomputed on each (the equal-mass
bins and the AURC order too), and the (1 - level) / 2 and (1 + level) / 2 quantiles (numpy's
default linear interpolation). ``resamples=0`` skips the bootstrap: low = high = value. A
percentile interval need not contain the estimate for a biased statistic: ECE is biased
upwards, so a well-calibrated model's ECE can sit below its own interval.

The bootstrap never builds the resampled arrays. A resample is a vector of counts (how often
each item was drawn), and every metric is written as a `Statistic` of those counts, so the
point estimate is the same function at counts = 1 and the two can never disagree. Each
statistic builder (here, in `typevet_async._core.statistics.reliability` and in
`typevet_async._core.statistics.selective`) precomputes what does not depend on the resample and
returns
a Statistic of the counts (m, n) -> (m, 1). Every resample has n draws, so each row of counts
sums to n.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import attrs
import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "Floats",
    "Interval",
    "Statistic",
    "as_column",
    "estimate",
    "mean_of",
    "resample_counts",
    "stacked",
]

#: Resample chunks hold at most this many counts (2 MiB of float64, cache-sized), whatever n is.
_CHUNK_ELEMENTS = 1 << 18

Floats = NDArray[np.float64]
#: A statistic maps counts (m resamples, n items) to values (m resamples, s statistics).
Statistic = Callable[[Floats], Floats]


@attrs.frozen
class Interval:
    """A point estimate and its bootstrap percentile interval ``[low, high]``."""

    value: float
    low: float
    high: float


def as_column(values: ArrayLike) -> Floats:
    """m values as an (m, 1) column."""
    return np.asarray(values, dtype=np.float64).reshape(-1, 1)


def mean_of(values: Floats) -> Statistic:
    """mean of an item quantity: counts @ values / n."""

    def statistic(counts: Floats) -> Floats:
        return as_column(counts @ values / counts.shape[1])

    return statistic


def stacked(*statistics: Statistic) -> Statistic:
    """Several statistics as one, their columns side by side."""

    def statistic(counts: Floats) -> Floats:
        return np.hstack([each(counts) for each in statistics])

    return statistic


def estimate(
    statistic: Statistic, n: int, *, resamples: int, level: float, rng: np.random.Generator
) -> list[Interval]:
    """Each column's value at counts = 1, and its percentile interval over the resamples."""
    values = statistic(np.ones((1, n)))[0]
    if resamples == 0:
        return [Interval(float(v), float(v), float(v)) for v in values]
    replicas = np.vstack([statistic(counts) for counts in resample_counts(n, resamples, rng)])
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(replicas, [tail, 1.0 - tail], axis=0)
    return [
        Interval(float(v), float(lo), float(hi))
        for v, lo, hi in zip(values, low, high, strict=True)
    ]


def resample_counts(n: int, resamples: int, rng: np.random.Generator) -> Iterator[Floats]:
    """Chunks of resamples; a row counts how often each of the n items was drawn (sum n)."""
    per_chunk = max(1, _CHUNK_ELEMENTS // n)
    for start in range(0, resamples, per_chunk):
        draws = rng.integers(0, n, size=(min(per_chunk, resamples - start), n))
        counts = np.empty(draws.shape)
        for row, drawn in enumerate(draws):
            counts[row] = np.bincount(drawn, minlength=n)
        yield counts
