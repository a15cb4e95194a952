"""Reliability: the calibration bins of a reliability diagram, and the ECE over them.

Inputs are per-item arrays: ``confidence`` (each item's top probability, or for a class-wise
ECE its probability of one option) and ``outcome`` / ``correct`` (1.0 where it was right).

- ECE = sum_b |b| / n * |accuracy_b - mean confidence_b| over the bins b.
- Equal width: ``bins`` bins with edges ``np.linspace(0, 1, bins + 1)``; bin j holds
  edges[j] < confidence <= edges[j + 1], except that the first bin also holds 0. A confidence of
  exactly 1.0 is in the last bin, and one exactly on an inner edge is in the bin below it.
- Equal mass: the ranking (`typevet_async._core.statistics.metrics`) cut into min(bins, n) groups of
  as-equal-as-possible size (``np.array_split``, so the larger groups are the more confident
  ones). Equal confidences may straddle a group boundary. The equal-mass bins are listed least
  confident first.

Empty bins are left out of the bins drawn. The two ECEs are `Statistic` builders of the
resample counts (`typevet_async._core.statistics.bootstrap`).
"""

from __future__ import annotations

import attrs
import numpy as np
from numpy.typing import NDArray

from typevet_async._core.statistics.bootstrap import Floats, Statistic, as_column

__all__ = ["Bin", "ece_equal_mass", "ece_equal_width", "equal_mass_bins", "equal_width_bins"]


@attrs.frozen
class Bin:
    """One non-empty calibration bin: its confidence range, size, mean confidence, accuracy.

    Equal-width bins carry their edges; equal-mass bins the lowest and highest confidence in them.
    """

    lower: float
    upper: float
    count: int
    confidence: float
    accuracy: float


# --- the ECE as a statistic of resample counts ---------------------------------------------


def _equal_width_index(confidence: Floats, bins: int) -> NDArray[np.intp]:
    """The equal-width bin of each confidence: right-closed, the first bin also holds 0."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    index = np.searchsorted(edges, confidence, side="left") - 1
    return np.clip(index, 0, bins - 1).astype(np.intp)


def ece_equal_width(confidence: Floats, outcome: Floats, bins: int) -> Statistic:
    """sum_b |sum_{i in b} counts_i (outcome_i - confidence_i)| / n.

    That is sum_b |b|/n |accuracy_b - confidence_b|, because each bin's gap is the mean of
    (outcome - confidence) over the bin. The bins do not move between resamples: only the
    counts weighting each item's gap do.
    """
    n = len(confidence)
    index = _equal_width_index(confidence, bins)
    gap = outcome - confidence

    def statistic(counts: Floats) -> Floats:
        sums = np.stack([np.bincount(index, weights=row * gap, minlength=bins) for row in counts])
        return as_column(np.abs(sums).sum(axis=1) / n)

    return statistic


def _group_bounds(n: int, bins: int) -> NDArray[np.intp]:
    """Start positions of np.array_split's min(bins, n) groups of n sorted positions, and n."""
    groups = min(bins, n)
    sizes = np.full(groups, n // groups, dtype=np.intp)
    sizes[: n % groups] += 1
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.intp)


def ece_equal_mass(ranked_confidence: Floats, ranked_outcome: Floats, bins: int) -> Statistic:
    """sum_g |sum of (outcome - confidence) over the positions of group g| / n, items ranked.

    A resample in ranking order lists item r counts[r] times, at positions
    [drawn_before[r], drawn_through[r]). The sum over the first `b` positions is the cumulative
    gap of the items wholly before b plus the share of the one item that straddles b; a group's
    sum is the difference of that at its two bounds.
    """
    n = len(ranked_confidence)
    gap = ranked_outcome - ranked_confidence
    inner = _group_bounds(n, bins)[1:-1].astype(np.float64)

    def statistic(counts: Floats) -> Floats:
        drawn_gap = counts * gap
        drawn_through = np.cumsum(counts, axis=1)
        gap_through = np.cumsum(drawn_gap, axis=1)
        straddling = _searchsorted_rows(drawn_through, inner)  # the item at each inner bound
        rows = np.arange(len(counts))[:, np.newaxis]
        drawn_before = drawn_through[rows, straddling] - counts[rows, straddling]
        gap_before = gap_through[rows, straddling] - drawn_gap[rows, straddling]
        at_inner = gap_before + (inner - drawn_before) * gap[straddling]
        at_bounds = np.column_stack([np.zeros(len(counts)), at_inner, gap_through[:, -1]])
        return as_column(np.abs(np.diff(at_bounds, axis=1)).sum(axis=1) / n)

    return statistic


def _searchsorted_rows(rows: Floats, queries: Floats) -> NDArray[np.intp]:
    """np.searchsorted(row, queries, side="right") for every row of a matrix at once.

    Every row is non-decreasing within [0, width]; shifting row i by i * (width + 1) makes the
    flattened matrix sorted, so one search answers all rows.
    """
    m, width = rows.shape
    shift = np.arange(m, dtype=np.float64)[:, np.newaxis] * (width + 1)
    found = np.searchsorted((rows + shift).ravel(), (queries + shift).ravel(), side="right")
    index = found.reshape(m, len(queries)) - np.arange(m)[:, np.newaxis] * width
    return np.asarray(index, dtype=np.intp)


# --- the bins of the reliability diagram ---------------------------------------------------


def equal_width_bins(confidence: Floats, correct: Floats, bins: int) -> tuple[Bin, ...]:
    """The non-empty equal-width bins, least confident first."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    index = _equal_width_index(confidence, bins)
    return tuple(
        _bin(float(edges[b]), float(edges[b + 1]), confidence[index == b], correct[index == b])
        for b in range(bins)
        if (index == b).any()
    )


def equal_mass_bins(
    ranked_confidence: Floats, ranked_correct: Floats, bins: int
) -> tuple[Bin, ...]:
    """The equal-mass groups of the ranking, least confident first."""
    groups = np.array_split(np.arange(len(ranked_confidence)), min(bins, len(ranked_confidence)))
    return tuple(
        _bin(
            float(ranked_confidence[g].min()),
            float(ranked_confidence[g].max()),
            ranked_confidence[g],
            ranked_correct[g],
        )
        for g in reversed(groups)
    )


def _bin(lower: float, upper: float, confidence: Floats, correct: Floats) -> Bin:
    return Bin(
        lower=lower,
        upper=upper,
        count=len(confidence),
        confidence=float(confidence.mean()),
        accuracy=float(correct.mean()),
    )
