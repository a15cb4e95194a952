"""Evaluation metrics for choice questions: accuracy, NLL, Brier, ECE, selective accuracy, AURC.

Inputs are ``probabilities``, a float array ``(n, k)`` whose rows are probability vectors over a
question's k options in option order, and ``gold``, an int array ``(n,)`` of the right option's
index. This module checks them, ranks the items and gathers every metric of one question into
its record; each metric is defined where it is computed:

- NLL and Brier: `typevet_async._core.statistics.losses`;
- ECE and the reliability diagram's bins (equal width, equal mass):
  `typevet_async._core.statistics.reliability`;
- selective accuracy and AURC: `typevet_async._core.statistics.selective`;
- the bootstrap intervals, and the counts every metric is a function of:
  `typevet_async._core.statistics.bootstrap`.

Definitions (p_i is item i's row, y_i its gold index):

- prediction_i = argmax p_i, ties to the lowest index (``np.argmax``).
- confidence_i = max p_i, the top probability. This is *not* the SDK's answer ``confidence``
  (System One's reference formula) nor its ``entropy_confidence`` (see
  ``typevet_async._core.reading.answers``): calibration asks whether "70%" is right 70% of the time,
  and only the top probability is a probability of being right.
- accuracy = mean_i [prediction_i == y_i].
- The ranking: the items sorted by confidence descending, stable (equal confidences keep item
  order). The equal-mass ECE, the AURC and the selective points all use this one.

`per_label` and `order_sensitivity` are defined in their records' docstrings.

Records convert to JSON-ready dicts with ``to_json()`` (plain ints, floats, None, lists; never
NaN). Empty bins are left out of ``bins_width`` and ``bins_mass``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
from numpy.typing import ArrayLike, NDArray

from typevet_async._core.statistics.bootstrap import Floats, Interval, estimate, mean_of, stacked
from typevet_async._core.statistics.losses import item_brier, item_nll
from typevet_async._core.statistics.reliability import (
    Bin,
    ece_equal_mass,
    ece_equal_width,
    equal_mass_bins,
    equal_width_bins,
)
from typevet_async._core.statistics.selective import CoveragePoint, aurc, selective_points

__all__ = [
    "LabelMetrics",
    "Metrics",
    "OrderSensitivity",
    "confidence_and_correct",
    "evaluate",
    "order_sensitivity",
    "per_label",
]

#: How far a row's sum may be from 1.
SUM_TOLERANCE = 1e-6


# --- records -------------------------------------------------------------------------------


@attrs.frozen
class Metrics:
    """Every metric of one question over ``count`` items (definitions in the module docstring).

    The scalar metrics are Intervals at ``level`` over ``resamples`` bootstrap resamples;
    ``bins_width`` and ``bins_mass`` (the non-empty ones of ``bins`` bins, least confident first)
    draw the reliability diagram; ``selective`` has one point per coverage in COVERAGES.
    """

    count: int
    accuracy: Interval
    nll: Interval
    brier: Interval
    ece_width: Interval
    ece_mass: Interval
    aurc: Interval
    bins_width: tuple[Bin, ...]
    bins_mass: tuple[Bin, ...]
    selective: tuple[CoveragePoint, ...]
    bins: int
    level: float
    resamples: int

    def to_json(self) -> dict[str, Any]:
        return _json_ready(self)


@attrs.frozen
class LabelMetrics:
    """One option's metrics.

    - support: items whose gold is this option; predicted: items predicted as it.
    - recall: accuracy on the support (None when support is 0).
    - precision: fraction of the predicted that are right (None when none is predicted).
    - mean_probability: the mean P(option) over all items (compare with support / n).
    - nll, brier: over the support only, resampled within the support (None when it is 0).
    - ece: class-wise ECE, equal width, of P(option) against [gold == option] over all items.
    """

    support: int
    predicted: int
    recall: float | None
    precision: float | None
    mean_probability: float
    nll: Interval | None
    brier: Interval | None
    ece: Interval

    def to_json(self) -> dict[str, Any]:
        return _json_ready(self)


@attrs.frozen
class OrderSensitivity:
    """How much the answers move when the options are shown in other orders.

    - flip_rate: fraction of items whose argmax is not the same under every order.
    - an item's change: max over options of (max over orders - min over orders) of P(option);
      mean_change and max_change over the items.
    """

    items: int
    rotations: int
    flip_rate: float
    mean_change: float
    max_change: float

    def to_json(self) -> dict[str, Any]:
        return _json_ready(self)


def _json_ready(record: attrs.AttrsInstance) -> dict[str, Any]:
    """The record as JSON's types: attrs.asdict keeps tuples, JSON wants lists."""

    def lists(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: lists(item) for key, item in value.items()}
        if isinstance(value, tuple | list):
            return [lists(item) for item in value]
        return value

    result: dict[str, Any] = lists(attrs.asdict(record))
    return result


# --- public functions ----------------------------------------------------------------------


def evaluate(
    probabilities: ArrayLike,
    gold: ArrayLike,
    *,
    bins: int = 10,
    resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> Metrics:
    """All metrics of one question, each scalar with its bootstrap interval."""
    p, y = _validated(probabilities, gold)
    _check_options(bins=bins, resamples=resamples, level=level)
    confidence, correct = _confidence_and_correct(p, y)
    # Every per-item array from here on is in ranking order, which the equal-mass ECE, the AURC
    # and the selective points read; the other metrics do not care about order.
    ranking = np.argsort(-confidence, kind="stable")
    confidence, correct = confidence[ranking], correct[ranking]
    statistics = stacked(
        mean_of(correct),
        mean_of(item_nll(p, y)[ranking]),
        mean_of(item_brier(p, y)[ranking]),
        ece_equal_width(confidence, correct, bins),
        ece_equal_mass(confidence, correct, bins),
        aurc(correct),
    )
    rng = np.random.default_rng(seed)
    accuracy, nll, brier, ece_width, ece_mass, area = estimate(
        statistics, len(y), resamples=resamples, level=level, rng=rng
    )
    return Metrics(
        count=len(y),
        accuracy=accuracy,
        nll=nll,
        brier=brier,
        ece_width=ece_width,
        ece_mass=ece_mass,
        aurc=area,
        bins_width=equal_width_bins(confidence, correct, bins),
        bins_mass=equal_mass_bins(confidence, correct, bins),
        selective=selective_points(confidence, correct),
        bins=int(bins),
        level=float(level),
        resamples=int(resamples),
    )


def per_label(
    probabilities: ArrayLike,
    gold: ArrayLike,
    labels: Sequence[str],
    *,
    bins: int = 10,
    resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, LabelMetrics]:
    """Each option's metrics (see `LabelMetrics`), keyed by its label, in option order.

    The class-wise ECEs share one resample of all items (``default_rng(seed)``); each option's
    NLL and Brier resample its own support (``default_rng([seed, 1 + option index])``), so an
    option's intervals are defined whenever it has support. The cost grows with n * k *
    resamples (about as much again as `evaluate` per option).
    """
    p, y = _validated(probabilities, gold)
    _check_options(bins=bins, resamples=resamples, level=level)
    n, k = p.shape
    if len(labels) != k or len(set(labels)) != k:
        raise ValueError(f"labels must be {k} distinct names, one per option; got {list(labels)}")
    prediction = p.argmax(axis=1)
    nlls, briers = item_nll(p, y), item_brier(p, y)
    classwise = stacked(
        *(ece_equal_width(p[:, j], (y == j).astype(np.float64), bins) for j in range(k))
    )
    eces = estimate(classwise, n, resamples=resamples, level=level, rng=np.random.default_rng(seed))
    result: dict[str, LabelMetrics] = {}
    for j, label in enumerate(labels):
        is_gold, is_predicted = y == j, prediction == j
        support, predicted = int(is_gold.sum()), int(is_predicted.sum())
        nll: Interval | None = None
        brier: Interval | None = None
        if support:
            rng = np.random.default_rng([seed, 1 + j])
            statistics = stacked(mean_of(nlls[is_gold]), mean_of(briers[is_gold]))
            nll, brier = estimate(statistics, support, resamples=resamples, level=level, rng=rng)
        result[label] = LabelMetrics(
            support=support,
            predicted=predicted,
            recall=float(np.mean(prediction[is_gold] == j)) if support else None,
            precision=float(np.mean(y[is_predicted] == j)) if predicted else None,
            mean_probability=float(p[:, j].mean()),
            nll=nll,
            brier=brier,
            ece=eces[j],
        )
    return result


def order_sensitivity(rotations: ArrayLike) -> OrderSensitivity:
    """Flip rate and probability changes across option orders.

    ``rotations[i, j]`` is item i's probability vector, in option order, read under the j-th
    option order: shape ``(n, r, k)`` with r >= 2.
    """
    array = np.asarray(rotations, dtype=np.float64)
    if array.ndim != 3:
        raise ValueError(f"rotations must have shape (n, r, k); got shape {array.shape}")
    n, r, k = array.shape
    if n == 0:
        raise ValueError("rotations has no items")
    if r < 2:
        raise ValueError(f"order sensitivity needs at least 2 orders; got {r}")
    if k < 2:
        raise ValueError(f"a question needs at least 2 options; rotations has {k}")
    _check_rows(array.reshape(n * r, k), "rotations")
    winners = array.argmax(axis=2)
    flipped = np.any(winners != winners[:, :1], axis=1)
    change = (array.max(axis=1) - array.min(axis=1)).max(axis=1)
    return OrderSensitivity(
        items=n,
        rotations=r,
        flip_rate=float(flipped.mean()),
        mean_change=float(change.mean()),
        max_change=float(change.max()),
    )


def confidence_and_correct(
    probabilities: ArrayLike, gold: ArrayLike
) -> tuple[Floats, NDArray[np.bool_]]:
    """Each item's top probability and whether its argmax is gold (for the confidence plot)."""
    p, y = _validated(probabilities, gold)
    confidence, correct = _confidence_and_correct(p, y)
    return confidence, correct.astype(np.bool_)


# --- validation ----------------------------------------------------------------------------


def _validated(probabilities: ArrayLike, gold: ArrayLike) -> tuple[Floats, NDArray[np.intp]]:
    p = np.asarray(probabilities, dtype=np.float64)
    y = np.asarray(gold)
    if p.ndim != 2:
        raise ValueError(f"probabilities must have shape (n, k); got shape {p.shape}")
    if y.ndim != 1:
        raise ValueError(f"gold must have shape (n,); got shape {y.shape}")
    n, k = p.shape
    if len(y) != n:
        raise ValueError(f"gold has {len(y)} items but probabilities has {n} rows")
    if n == 0:
        raise ValueError("no items: probabilities and gold are empty")
    if k < 2:
        raise ValueError(f"a question needs at least 2 options; probabilities has {k}")
    if not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"gold must hold integer option indices; got dtype {y.dtype}")
    outside = (y < 0) | (y >= k)
    if outside.any():
        first = int(np.flatnonzero(outside)[0])
        raise ValueError(f"gold[{first}] = {y[first]} is not an option index in [0, {k})")
    _check_rows(p, "probabilities")
    return p, y.astype(np.intp)


def _check_rows(p: Floats, name: str) -> None:
    """Every row finite, non-negative and summing to 1 within SUM_TOLERANCE."""
    if not np.isfinite(p).all():
        raise ValueError(f"{name} has non-finite values (NaN or infinity)")
    if (p < 0).any():
        raise ValueError(f"{name} has negative values")
    sums = p.sum(axis=1)
    off = np.abs(sums - 1.0) > SUM_TOLERANCE
    if off.any():
        first = int(np.flatnonzero(off)[0])
        raise ValueError(
            f"{name} row {first} sums to {float(sums[first])!r}, not 1 (tolerance {SUM_TOLERANCE})"
        )


def _check_options(*, bins: int, resamples: int, level: float) -> None:
    if bins < 1:
        raise ValueError(f"bins must be at least 1; got {bins}")
    if resamples < 0:
        raise ValueError(f"resamples must be 0 or more; got {resamples}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be strictly between 0 and 1; got {level}")


# --- confidence and correctness ----------------------------------------------------------


def _confidence_and_correct(p: Floats, y: NDArray[np.intp]) -> tuple[Floats, Floats]:
    """Top probability, and 1.0 where the argmax (ties to the lowest index) is gold."""
    return p.max(axis=1), (p.argmax(axis=1) == y).astype(np.float64)
