"""Selective prediction: accuracy when only the most confident items are answered, and the AURC.

Both read the ranking (`typevet_async._core.statistics.metrics`): the items sorted by confidence
descending, stable.

- selective accuracy at coverage c (0.1, 0.2, ..., 1.0): the first ceil(c * n) items of the
  ranking kept; the accuracy of those, and the threshold, the lowest confidence kept.
- AURC = mean_{i=1..n} risk_i, where risk_i = 1 - accuracy of the first i items of the ranking:
  the area under the empirical risk-coverage step curve. Lower is better. It is a `Statistic`
  of the resample counts (`typevet_async._core.statistics.bootstrap`).
"""

from __future__ import annotations

import attrs
import numpy as np

from typevet_async._core.statistics.bootstrap import Floats, Statistic, as_column

__all__ = ["COVERAGES", "COVERAGE_TENTHS", "CoveragePoint", "aurc", "selective_points"]

#: Coverages of the selective-accuracy points, as tenths (integers keep ceil(c * n) exact).
COVERAGE_TENTHS: tuple[int, ...] = tuple(range(1, 11))
COVERAGES: tuple[float, ...] = tuple(tenth / 10 for tenth in COVERAGE_TENTHS)


@attrs.frozen
class CoveragePoint:
    """Selective accuracy of the ``kept`` first items of the ranking; ``threshold`` is the
    lowest confidence among them (ties with it may be left out)."""

    coverage: float
    kept: int
    accuracy: float
    threshold: float


def aurc(ranked_correct: Floats) -> Statistic:
    """mean_{i=1..n} (errors among the first i ranked positions) / i.

    Rearranged for resample counts c_r (item r fills the positions t_{r-1}+1 .. t_r, t the
    running total of c): a wrong item at 1-based position j adds 1/i to every risk_i with i >= j,
    in all H_n - H_{j-1} (H the harmonic numbers). Summed over item r's positions that is
    c_r H_n - (S[t_r] - S[t_{r-1}]) with S[m] = H_0 + ... + H_{m-1}. Against the errors e,
    the second part telescopes: sum_r (S[t_r] - S[t_{r-1}]) e_r = sum_r S[t_r] (e_r - e_{r+1}).
    """
    n = len(ranked_correct)
    error = 1.0 - ranked_correct
    error_drop = error - np.append(error[1:], 0.0)  # e_r - e_{r+1}, e_n = 0
    harmonic = np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, n + 1))])
    harmonic_sums = np.concatenate([[0.0], np.cumsum(harmonic[:-1])])

    def statistic(counts: Floats) -> Floats:
        through = np.cumsum(counts, axis=1, dtype=np.intp)
        spread = np.take(harmonic_sums, through) @ error_drop
        return as_column((harmonic[n] * (counts @ error) - spread) / n)

    return statistic


def selective_points(
    ranked_confidence: Floats, ranked_correct: Floats
) -> tuple[CoveragePoint, ...]:
    """One point per coverage in COVERAGES."""
    n = len(ranked_confidence)
    points = []
    for tenth in COVERAGE_TENTHS:
        kept = (tenth * n + 9) // 10  # ceil(tenth / 10 * n) in integers: no 0.3 * 10 > 3
        points.append(
            CoveragePoint(
                coverage=tenth / 10,
                kept=kept,
                accuracy=float(ranked_correct[:kept].mean()),
                threshold=float(ranked_confidence[kept - 1]),
            )
        )
    return tuple(points)
