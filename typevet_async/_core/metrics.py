"""Evaluation metrics for choice questions: accuracy, NLL, Brier, ECE, selective accuracy, AURC.

Inputs are ``probabilities``, a float array ``(n, k)`` whose rows are probability vectors over a
question's k options in option order, and ``gold``, an int array ``(n,)`` of the right option's
index.

Definitions (p_i is item i's row, y_i its gold index):

- prediction_i = argmax p_i, ties to the lowest index (``np.argmax``).
- confidence_i = max p_i, the top probability. This is *not* the SDK's answer ``confidence``
  (1 - normalised entropy, see ``typevet_async._core.answers``): calibration asks whether "70%"
  is right 70% of the time, and only the top probability is a probability of being right.
- accuracy = mean_i [prediction_i == y_i].
- NLL = mean_i -ln(max(p_i[y_i], 1e-12)). The clip keeps one item that put zero mass on its gold
  option from making the mean infinite (and the JSON report invalid); it caps an item's loss
  at -ln(1e-12) ~ 27.6 nats.
- Brier = mean_i sum_k (p_ik - [k == y_i])^2, the multi-class form, in [0, 2]. For two options
  it is twice the binary Brier score (p_true - outcome)^2.
- ECE = sum_b |b| / n * |accuracy_b - mean confidence_b| over the bins b.
  Equal width: ``bins`` bins with edges ``np.linspace(0, 1, bins + 1)``; bin j holds
  edges[j] < confidence <= edges[j + 1], except that the first bin also holds 0. A confidence of
  exactly 1.0 is in the last bin, and one exactly on an inner edge is in the bin below it.
- The ranking: the items sorted by confidence descending, stable (equal confidences keep item
  order). The three metrics below that need an order all use this one.
- Equal mass: the ranking cut into min(bins, n) groups of as-equal-as-possible size
  (``np.array_split``, so the larger groups are the more confident ones). Equal confidences
  may straddle a group boundary. ``bins_mass`` lists the groups least confident first.
- selective accuracy at coverage c (0.1, 0.2, ..., 1.0): the first ceil(c * n) items of the
  ranking kept; the accuracy of those, and the threshold, the lowest confidence kept.
- AURC = mean_{i=1..n} risk_i, where risk_i = 1 - accuracy of the first i items of the ranking:
  the area under the empirical risk-coverage step curve. Lower is better.

`per_label` and `order_sensitivity` are defined in their records' docstrings.

Intervals are bootstrap percentile intervals: ``resamples`` resamples of the n items with
replacement (``numpy.random.default_rng(seed)``), every scalar metric recomputed on each (the
equal-mass bins and the AURC order too), and the (1 - level) / 2 and (1 + level) / 2 quantiles
(numpy's default linear interpolation). ``resamples=0`` skips the bootstrap: low = high = value.
A percentile interval need not contain the estimate for a biased statistic: ECE is biased
upwards, so a well-calibrated model's ECE can sit below its own interval.

The bootstrap never builds the resampled arrays. A resample is a vector of counts (how often
each item was drawn), and every metric is written as a function of those counts, so the point
estimate is the same function at counts = 1 and the two can never disagree.

Records convert to JSON-ready dicts with ``to_json()`` (plain ints, floats, None, lists; never
NaN). Empty bins are left out of ``bins_width`` and ``bins_mass``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "COVERAGES",
    "NLL_FLOOR",
    "Bin",
    "CoveragePoint",
    "Interval",
    "LabelMetrics",
    "Metrics",
    "OrderSensitivity",
    "confidence_and_correct",
    "evaluate",
    "order_sensitivity",
    "per_label",
]

#: The smallest gold probability the NLL takes the log of.
NLL_FLOOR = 1e-12
#: How far a row's sum may be from 1.
SUM_TOLERANCE = 1e-6
#: Coverages of the selective-accuracy points, as tenths (integers keep ceil(c * n) exact).
COVERAGE_TENTHS: tuple[int, ...] = tuple(range(1, 11))
COVERAGES: tuple[float, ...] = tuple(tenth / 10 for tenth in COVERAGE_TENTHS)
#: Resample chunks hold at most this many counts (2 MiB of float64, cache-sized), whatever n is.
_CHUNK_ELEMENTS = 1 << 18

Floats = NDArray[np.float64]
#: A statistic maps counts (m resamples, n items) to values (m resamples, s statistics).
Statistic = Callable[[Floats], Floats]


# --- records -------------------------------------------------------------------------------


@attrs.frozen
class Interval:
    """A point estimate and its bootstrap percentile interval ``[low, high]``."""

    value: float
    low: float
    high: float


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


@attrs.frozen
class CoveragePoint:
    """Selective accuracy of the ``kept`` first items of the ranking; ``threshold`` is the
    lowest confidence among them (ties with it may be left out)."""

    coverage: float
    kept: int
    accuracy: float
    threshold: float


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
    statistics = _stacked(
        _mean(correct),
        _mean(_item_nll(p, y)[ranking]),
        _mean(_item_brier(p, y)[ranking]),
        _ece_equal_width(confidence, correct, bins),
        _ece_equal_mass(confidence, correct, bins),
        _aurc(correct),
    )
    rng = np.random.default_rng(seed)
    accuracy, nll, brier, ece_width, ece_mass, aurc = _estimate(
        statistics, len(y), resamples=resamples, level=level, rng=rng
    )
    return Metrics(
        count=len(y),
        accuracy=accuracy,
        nll=nll,
        brier=brier,
        ece_width=ece_width,
        ece_mass=ece_mass,
        aurc=aurc,
        bins_width=_equal_width_bins(confidence, correct, bins),
        bins_mass=_equal_mass_bins(confidence, correct, bins),
        selective=_selective(confidence, correct),
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
    item_nll, item_brier = _item_nll(p, y), _item_brier(p, y)
    classwise = _stacked(
        *(_ece_equal_width(p[:, j], (y == j).astype(np.float64), bins) for j in range(k))
    )
    eces = _estimate(
        classwise, n, resamples=resamples, level=level, rng=np.random.default_rng(seed)
    )
    result: dict[str, LabelMetrics] = {}
    for j, label in enumerate(labels):
        is_gold, is_predicted = y == j, prediction == j
        support, predicted = int(is_gold.sum()), int(is_predicted.sum())
        nll: Interval | None = None
        brier: Interval | None = None
        if support:
            rng = np.random.default_rng([seed, 1 + j])
            statistics = _stacked(_mean(item_nll[is_gold]), _mean(item_brier[is_gold]))
            nll, brier = _estimate(statistics, support, resamples=resamples, level=level, rng=rng)
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


# --- per-item quantities -------------------------------------------------------------------


def _confidence_and_correct(p: Floats, y: NDArray[np.intp]) -> tuple[Floats, Floats]:
    """Top probability, and 1.0 where the argmax (ties to the lowest index) is gold."""
    return p.max(axis=1), (p.argmax(axis=1) == y).astype(np.float64)


def _gold_probability(p: Floats, y: NDArray[np.intp]) -> Floats:
    gold: Floats = p[np.arange(len(y)), y]  # typed here: some numpy stubs give Any
    return gold


def _item_nll(p: Floats, y: NDArray[np.intp]) -> Floats:
    """-ln(max(p[gold], NLL_FLOOR))."""
    nll: Floats = -np.log(np.maximum(_gold_probability(p, y), NLL_FLOOR))
    return nll


def _item_brier(p: Floats, y: NDArray[np.intp]) -> Floats:
    """sum_k (p_k - onehot_k)^2."""
    onehot = np.zeros_like(p)
    onehot[np.arange(len(y)), y] = 1.0
    return np.asarray(((p - onehot) ** 2).sum(axis=1), dtype=np.float64)


# --- statistics of resample counts ---------------------------------------------------------
# Each builder precomputes what does not depend on the resample and returns a Statistic of the
# counts (m, n) -> (m, 1). Every resample has n draws, so each row of counts sums to n.


def _column(values: ArrayLike) -> Floats:
    """m values as an (m, 1) column."""
    return np.asarray(values, dtype=np.float64).reshape(-1, 1)


def _mean(values: Floats) -> Statistic:
    """mean of an item quantity: counts @ values / n."""

    def statistic(counts: Floats) -> Floats:
        return _column(counts @ values / counts.shape[1])

    return statistic


def _equal_width_index(confidence: Floats, bins: int) -> NDArray[np.intp]:
    """The equal-width bin of each confidence: right-closed, the first bin also holds 0."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    index = np.searchsorted(edges, confidence, side="left") - 1
    return np.clip(index, 0, bins - 1).astype(np.intp)


def _ece_equal_width(confidence: Floats, outcome: Floats, bins: int) -> Statistic:
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
        return _column(np.abs(sums).sum(axis=1) / n)

    return statistic


def _group_bounds(n: int, bins: int) -> NDArray[np.intp]:
    """Start positions of np.array_split's min(bins, n) groups of n sorted positions, and n."""
    groups = min(bins, n)
    sizes = np.full(groups, n // groups, dtype=np.intp)
    sizes[: n % groups] += 1
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.intp)


def _ece_equal_mass(ranked_confidence: Floats, ranked_outcome: Floats, bins: int) -> Statistic:
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
        return _column(np.abs(np.diff(at_bounds, axis=1)).sum(axis=1) / n)

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


def _aurc(ranked_correct: Floats) -> Statistic:
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
        return _column((harmonic[n] * (counts @ error) - spread) / n)

    return statistic


def _stacked(*statistics: Statistic) -> Statistic:
    """Several statistics as one, their columns side by side."""

    def statistic(counts: Floats) -> Floats:
        return np.hstack([each(counts) for each in statistics])

    return statistic


# --- the bootstrap -------------------------------------------------------------------------


def _estimate(
    statistic: Statistic, n: int, *, resamples: int, level: float, rng: np.random.Generator
) -> list[Interval]:
    """Each column's value at counts = 1, and its percentile interval over the resamples."""
    values = statistic(np.ones((1, n)))[0]
    if resamples == 0:
        return [Interval(float(v), float(v), float(v)) for v in values]
    replicas = np.vstack([statistic(counts) for counts in _resample_counts(n, resamples, rng)])
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(replicas, [tail, 1.0 - tail], axis=0)
    return [
        Interval(float(v), float(lo), float(hi))
        for v, lo, hi in zip(values, low, high, strict=True)
    ]


def _resample_counts(n: int, resamples: int, rng: np.random.Generator) -> Iterator[Floats]:
    """Chunks of resamples; a row counts how often each of the n items was drawn (sum n)."""
    per_chunk = max(1, _CHUNK_ELEMENTS // n)
    for start in range(0, resamples, per_chunk):
        draws = rng.integers(0, n, size=(min(per_chunk, resamples - start), n))
        counts = np.empty(draws.shape)
        for row, drawn in enumerate(draws):
            counts[row] = np.bincount(drawn, minlength=n)
        yield counts


# --- bins and selective points -------------------------------------------------------------


def _equal_width_bins(confidence: Floats, correct: Floats, bins: int) -> tuple[Bin, ...]:
    edges = np.linspace(0.0, 1.0, bins + 1)
    index = _equal_width_index(confidence, bins)
    return tuple(
        _bin(float(edges[b]), float(edges[b + 1]), confidence[index == b], correct[index == b])
        for b in range(bins)
        if (index == b).any()
    )


def _equal_mass_bins(
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


def _selective(ranked_confidence: Floats, ranked_correct: Floats) -> tuple[CoveragePoint, ...]:
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
