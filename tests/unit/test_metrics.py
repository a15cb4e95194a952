"""typevet_async._core.statistics.metrics (and the losses, reliability, selective and bootstrap
modules it
gathers) against values worked out by hand on small fixed inputs."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from typevet_async._core.statistics import bootstrap, metrics
from typevet_async._core.statistics.bootstrap import Interval
from typevet_async._core.statistics.metrics import evaluate, order_sensitivity, per_label
from typevet_async._core.statistics.reliability import Bin
from typevet_async._core.statistics.selective import COVERAGES

# Case A: 4 items, 2 options.
#   item  p            gold  prediction  correct  confidence  p[gold]
#   0     [0.9, 0.1]   0     0           1        0.9         0.9
#   1     [0.2, 0.8]   1     1           1        0.8         0.8
#   2     [0.6, 0.4]   1     0           0        0.6         0.4
#   3     [0.3, 0.7]   0     1           0        0.7         0.3
# Ranking (confidence descending): 0 (0.9, right), 1 (0.8, right), 3 (0.7, wrong), 2 (0.6, wrong).
CASE_A = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])
GOLD_A = np.array([0, 1, 1, 0])

# Case B: 5 items, 3 options, with an argmax tie (item 2) and confidences on bin edges.
#   item  p                gold  prediction  correct  confidence  p[gold]
#   0     [0.5, 0.3, 0.2]  0     0           1        0.5         0.5
#   1     [0.2, 0.7, 0.1]  1     1           1        0.7         0.7
#   2     [0.4, 0.4, 0.2]  1     0 (tie)     0        0.4         0.4
#   3     [0.1, 0.1, 0.8]  0     2           0        0.8         0.1
#   4     [0.0, 0.0, 1.0]  2     2           1        1.0         1.0
# Ranking: 4 (1.0, right), 3 (0.8, wrong), 1 (0.7, right), 0 (0.5, right), 2 (0.4, wrong).
CASE_B = np.array(
    [
        [0.5, 0.3, 0.2],
        [0.2, 0.7, 0.1],
        [0.4, 0.4, 0.2],
        [0.1, 0.1, 0.8],
        [0.0, 0.0, 1.0],
    ]
)
GOLD_B = np.array([0, 1, 1, 0, 2])

EXACT = 1e-12


def approx(value: float) -> Any:
    return pytest.approx(value, rel=EXACT, abs=EXACT)


def point(probabilities: Any, gold: Any, **options: Any) -> metrics.Metrics:
    return evaluate(probabilities, gold, resamples=0, **options)


# --- case A --------------------------------------------------------------------------------


def test_case_a_accuracy_nll_brier() -> None:
    m = point(CASE_A, GOLD_A)
    assert m.count == 4
    assert m.accuracy.value == approx(0.5)  # 2 of 4 right
    # -(ln 0.9 + ln 0.8 + ln 0.4 + ln 0.3) / 4 = (0.10536 + 0.22314 + 0.91629 + 1.20397) / 4
    expected_nll = -(math.log(0.9) + math.log(0.8) + math.log(0.4) + math.log(0.3)) / 4
    assert m.nll.value == approx(expected_nll)
    assert m.nll.value == pytest.approx(0.6121919, abs=1e-7)
    # Brier per item: 0.1² + 0.1² = 0.02; 0.2² + 0.2² = 0.08; 0.6² + 0.6² = 0.72;
    # 0.7² + 0.7² = 0.98. Mean 1.80 / 4 = 0.45: twice the binary 0.225.
    assert m.brier.value == approx(0.45)


def test_case_a_ece_equal_width() -> None:
    # 10 bins: 0.9 in (0.8, 0.9], 0.8 in (0.7, 0.8], 0.7 in (0.6, 0.7], 0.6 in (0.5, 0.6],
    # one item each: (|1 - 0.9| + |1 - 0.8| + |0 - 0.7| + |0 - 0.6|) / 4 = 1.6 / 4 = 0.4.
    m = point(CASE_A, GOLD_A)
    assert m.ece_width.value == approx(0.4)
    assert m.bins_width == (
        Bin(0.5, approx(0.6), 1, 0.6, 0.0),
        Bin(approx(0.6), approx(0.7), 1, 0.7, 0.0),
        Bin(approx(0.7), 0.8, 1, 0.8, 1.0),
        Bin(0.8, 0.9, 1, 0.9, 1.0),
    )
    # 2 bins: all four in (0.5, 1]: |accuracy 0.5 - mean confidence 0.75| = 0.25.
    two = point(CASE_A, GOLD_A, bins=2)
    assert two.ece_width.value == approx(0.25)
    assert two.bins_width == (Bin(0.5, 1.0, 4, approx(0.75), approx(0.5)),)


def test_case_a_ece_equal_mass() -> None:
    # 2 groups of the ranking: {0, 1} (confidence 0.85, accuracy 1) and {3, 2} (0.65, 0):
    # 2/4 * 0.15 + 2/4 * 0.65 = 0.4.
    m = point(CASE_A, GOLD_A, bins=2)
    assert m.ece_mass.value == approx(0.4)
    assert m.bins_mass == (
        Bin(0.6, 0.7, 2, approx(0.65), 0.0),
        Bin(0.8, 0.9, 2, approx(0.85), 1.0),
    )


def test_case_a_selective_and_aurc() -> None:
    m = point(CASE_A, GOLD_A)
    # kept = ceil(c * 4): 1, 1, 2, 2, 2, 3, 3, 4, 4, 4 for c = 0.1 .. 1.0.
    # Ranked correct 1, 1, 0, 0 and confidences 0.9, 0.8, 0.7, 0.6.
    expected = [
        (1, 1.0, 0.9),
        (1, 1.0, 0.9),
        (2, 1.0, 0.8),
        (2, 1.0, 0.8),
        (2, 1.0, 0.8),
        (3, 2 / 3, 0.7),
        (3, 2 / 3, 0.7),
        (4, 0.5, 0.6),
        (4, 0.5, 0.6),
        (4, 0.5, 0.6),
    ]
    assert [s.coverage for s in m.selective] == list(COVERAGES)
    assert [(s.kept, s.accuracy, s.threshold) for s in m.selective] == [
        (kept, approx(accuracy), threshold) for kept, accuracy, threshold in expected
    ]
    # Risk of the first 1, 2, 3, 4: 0, 0, 1/3, 2/4; mean (5/6) / 4 = 5/24.
    assert m.aurc.value == approx(5 / 24)


def test_case_a_per_label() -> None:
    labels = per_label(CASE_A, GOLD_A, ["a", "b"], bins=2, resamples=0)
    assert list(labels) == ["a", "b"]
    a, b = labels["a"], labels["b"]
    # a: gold on items 0, 3; predicted on 0, 2. Recall 1/2 (0 right, 3 wrong), precision 1/2.
    assert (a.support, a.predicted, a.recall, a.precision) == (2, 2, 0.5, 0.5)
    assert a.mean_probability == approx((0.9 + 0.2 + 0.6 + 0.3) / 4)  # 0.5
    assert a.nll is not None
    assert a.brier is not None
    assert a.nll.value == approx(-(math.log(0.9) + math.log(0.3)) / 2)
    assert a.brier.value == approx((0.02 + 0.98) / 2)  # 0.5
    # Class-wise ECE, P(a) = 0.9, 0.2, 0.6, 0.3 against a-is-gold = 1, 0, 0, 1, 2 bins:
    # [0, 0.5]: {0.2 -> 0, 0.3 -> 1}: |0.5 - 0.25| = 0.25; (0.5, 1]: {0.9 -> 1, 0.6 -> 0}:
    # |0.5 - 0.75| = 0.25. 2/4 * 0.25 + 2/4 * 0.25 = 0.25.
    assert a.ece.value == approx(0.25)
    # b: gold on items 1, 2; predicted on 1, 3. Recall 1/2, precision 1/2.
    assert (b.support, b.predicted, b.recall, b.precision) == (2, 2, 0.5, 0.5)
    assert b.mean_probability == approx(0.5)
    assert b.nll is not None
    assert b.brier is not None
    assert b.nll.value == approx(-(math.log(0.8) + math.log(0.4)) / 2)
    assert b.brier.value == approx((0.08 + 0.72) / 2)  # 0.4
    assert b.ece.value == approx(0.25)  # the mirror image of a's


# --- case B --------------------------------------------------------------------------------


def test_case_b_accuracy_nll_brier() -> None:
    m = point(CASE_B, GOLD_B, bins=5)
    assert m.accuracy.value == approx(3 / 5)
    # -(ln 0.5 + ln 0.7 + ln 0.4 + ln 0.1 + ln 1) / 5 = (0.69315 + 0.35667 + 0.91629 + 2.30259) / 5
    expected_nll = -(math.log(0.5) + math.log(0.7) + math.log(0.4) + math.log(0.1)) / 5
    assert m.nll.value == approx(expected_nll)
    assert m.nll.value == pytest.approx(0.8537396, abs=1e-7)
    # Brier: 0.25+0.09+0.04 = 0.38; 0.04+0.09+0.01 = 0.14; 0.16+0.36+0.04 = 0.56;
    # 0.81+0.01+0.64 = 1.46; 0. Mean 2.54 / 5 = 0.508.
    assert m.brier.value == approx(0.508)


def test_case_b_ece_equal_width_edges() -> None:
    # 5 bins, right-closed: 0.4 is in (0.2, 0.4], 0.5 in (0.4, 0.6], 0.7 and 0.8 in (0.6, 0.8],
    # 1.0 in (0.8, 1.0].
    # (1/5)|0 - 0.4| + (1/5)|1 - 0.5| + (2/5)|0.5 - 0.75| + (1/5)|1 - 1| = 0.08 + 0.1 + 0.1 = 0.28
    m = point(CASE_B, GOLD_B, bins=5)
    assert m.ece_width.value == approx(0.28)
    assert m.bins_width == (
        Bin(approx(0.2), approx(0.4), 1, 0.4, 0.0),
        Bin(approx(0.4), approx(0.6), 1, 0.5, 1.0),
        Bin(approx(0.6), approx(0.8), 2, approx(0.75), 0.5),
        Bin(approx(0.8), 1.0, 1, 1.0, 1.0),
    )


def test_case_b_ece_equal_mass() -> None:
    # 2 groups of the ranking, sizes 3 and 2 (np.array_split: the larger first):
    # {4, 3, 1}: accuracy 2/3, confidence 2.5/3: 3/5 * 1/6 = 0.1;
    # {0, 2}: accuracy 1/2, confidence 0.45: 2/5 * 0.05 = 0.02. ECE 0.12.
    m = point(CASE_B, GOLD_B, bins=2)
    assert m.ece_mass.value == approx(0.12)
    assert m.bins_mass == (
        Bin(0.4, 0.5, 2, approx(0.45), 0.5),
        Bin(0.7, 1.0, 3, approx(2.5 / 3), approx(2 / 3)),
    )


def test_case_b_selective_and_aurc() -> None:
    m = point(CASE_B, GOLD_B)
    # kept = ceil(c * 5): 1, 1, 2, 2, 3, 3, 4, 4, 5, 5. Ranked correct 1, 0, 1, 1, 0.
    expected = [
        (1, 1.0, 1.0),
        (1, 1.0, 1.0),
        (2, 0.5, 0.8),
        (2, 0.5, 0.8),
        (3, 2 / 3, 0.7),
        (3, 2 / 3, 0.7),
        (4, 0.75, 0.5),
        (4, 0.75, 0.5),
        (5, 0.6, 0.4),
        (5, 0.6, 0.4),
    ]
    assert [(s.kept, s.accuracy, s.threshold) for s in m.selective] == [
        (kept, approx(accuracy), threshold) for kept, accuracy, threshold in expected
    ]
    # Risks 0, 1/2, 1/3, 1/4, 2/5: (30 + 20 + 15 + 24) / 60 = 89/60; / 5 = 89/300.
    assert m.aurc.value == approx(89 / 300)


def test_case_b_per_label() -> None:
    labels = per_label(CASE_B, GOLD_B, ["x", "y", "z"], bins=5, resamples=0)
    x, y, z = labels["x"], labels["y"], labels["z"]
    # x: gold 0, 3; predicted 0, 2 -> recall 1/2, precision 1/2; mean P 1.2 / 5.
    assert (x.support, x.predicted, x.recall, x.precision) == (2, 2, 0.5, 0.5)
    assert x.mean_probability == approx(0.24)
    assert x.nll is not None
    assert x.brier is not None
    assert x.nll.value == approx(-(math.log(0.5) + math.log(0.1)) / 2)
    assert x.brier.value == approx((0.38 + 1.46) / 2)  # 0.92
    # P(x) = 0.5, 0.2, 0.4, 0.1, 0.0 against 1, 0, 0, 1, 0 in 5 bins:
    # [0, 0.2]: {0.2, 0.1, 0.0} (0 is in the first bin, 0.2 on its right edge), mean 0.1,
    # outcome 1/3: 3/5 * (1/3 - 0.1); (0.2, 0.4]: {0.4 -> 0}: 1/5 * 0.4;
    # (0.4, 0.6]: {0.5 -> 1}: 1/5 * 0.5. 0.14 + 0.08 + 0.1 = 0.32.
    assert x.ece.value == approx(0.32)
    # y: gold 1, 2; predicted 1 -> recall 1/2, precision 1; mean P 1.5 / 5.
    assert (y.support, y.predicted, y.recall, y.precision) == (2, 1, 0.5, 1.0)
    assert y.mean_probability == approx(0.3)
    assert y.nll is not None
    assert y.brier is not None
    assert y.nll.value == approx(-(math.log(0.7) + math.log(0.4)) / 2)
    assert y.brier.value == approx((0.14 + 0.56) / 2)  # 0.35
    # P(y) = 0.3, 0.7, 0.4, 0.1, 0.0 against 0, 1, 1, 0, 0:
    # [0, 0.2]: {0.1, 0.0 -> 0}: 2/5 * 0.05; (0.2, 0.4]: {0.3 -> 0, 0.4 -> 1}: 2/5 * 0.15;
    # (0.6, 0.8]: {0.7 -> 1}: 1/5 * 0.3. 0.02 + 0.06 + 0.06 = 0.14.
    assert y.ece.value == approx(0.14)
    # z: gold 4; predicted 3, 4 -> recall 1, precision 1/2; mean P 2.3 / 5.
    assert (z.support, z.predicted, z.recall, z.precision) == (1, 2, 1.0, 0.5)
    assert z.mean_probability == approx(0.46)
    assert z.nll == Interval(0.0, 0.0, 0.0)  # -ln 1
    assert z.brier == Interval(0.0, 0.0, 0.0)
    # P(z) = 0.2, 0.1, 0.2, 0.8, 1.0 against 0, 0, 0, 0, 1:
    # [0, 0.2]: {0.2, 0.1, 0.2 -> 0}: 3/5 * 0.5/3; (0.6, 0.8]: {0.8 -> 0}: 1/5 * 0.8;
    # (0.8, 1]: {1.0 -> 1}: 0. 0.1 + 0.16 = 0.26.
    assert z.ece.value == approx(0.26)


def test_a_label_without_support_or_predictions() -> None:
    # Gold 0, 1; predicted 0, 0. Label c is never gold nor predicted, b never predicted.
    probabilities = [[0.7, 0.2, 0.1], [0.6, 0.3, 0.1]]
    labels = per_label(probabilities, [0, 1], ["a", "b", "c"], resamples=50)
    assert labels["b"].precision is None
    assert labels["b"].recall == 0.0
    c = labels["c"]
    assert (c.support, c.predicted, c.recall, c.precision, c.nll, c.brier) == (
        0,
        0,
        None,
        None,
        None,
        None,
    )
    assert c.mean_probability == approx(0.1)
    assert c.ece.value == approx(0.1)  # both at 0.1 in [0, 0.1], never gold


def test_labels_must_match_the_options() -> None:
    with pytest.raises(ValueError, match="2 distinct names"):
        per_label(CASE_A, GOLD_A, ["a"])
    with pytest.raises(ValueError, match="2 distinct names"):
        per_label(CASE_A, GOLD_A, ["a", "a"])


# --- definitions on edge cases -------------------------------------------------------------


def test_nll_clips_a_zero_gold_probability() -> None:
    # Item 1 puts no mass on its gold option: -ln(1e-12) = 27.631, not infinity.
    m = point([[1.0, 0.0], [1.0, 0.0]], [0, 1])
    assert m.nll.value == approx(-math.log(1e-12) / 2)
    assert math.isfinite(m.nll.value)


def test_ties_keep_item_order_in_the_ranking() -> None:
    # Three items at confidence 0.6: wrong, right, right in item order.
    probabilities = [[0.6, 0.4]] * 3
    m = point(probabilities, [1, 0, 0], bins=2)
    # Risks of the first 1, 2, 3: 1, 1/2, 1/3; mean 11/18.
    assert m.aurc.value == approx(11 / 18)
    assert m.selective[0].accuracy == 0.0  # ceil(0.1 * 3) = 1: the first item, wrong
    # Equal mass cuts the tie: {0, 1} (accuracy 1/2) and {2} (1), confidence 0.6 in both:
    # 2/3 * 0.1 + 1/3 * 0.4 = 0.2. Equal width: one bin, |2/3 - 0.6| = 1/15.
    assert m.ece_mass.value == approx(0.2)
    assert m.ece_width.value == approx(1 / 15)


def test_more_bins_than_items_gives_one_item_per_group() -> None:
    m = point(CASE_A, GOLD_A, bins=50)
    assert [b.count for b in m.bins_mass] == [1, 1, 1, 1]
    assert m.ece_mass.value == approx(0.4)  # mean |correct - confidence|


# --- the bootstrap -------------------------------------------------------------------------


def miscalibrated(n: int = 300, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """Three options, confident answers that are right far less often than they claim."""
    rng = np.random.default_rng(seed)
    probabilities = rng.dirichlet([0.3, 0.3, 0.3], size=n)
    right = rng.random(n) < 0.5
    gold = np.where(right, probabilities.argmax(axis=1), rng.integers(0, 3, n))
    return probabilities, gold


SCALARS = ("accuracy", "nll", "brier", "ece_width", "ece_mass", "aurc")


def test_intervals_contain_the_estimate() -> None:
    probabilities, gold = miscalibrated()
    m = evaluate(probabilities, gold, resamples=400)
    for name in SCALARS:
        interval = getattr(m, name)
        assert interval.low <= interval.value <= interval.high, name
        assert interval.low < interval.high, name
    assert (m.level, m.resamples) == (0.95, 400)


def test_the_same_seed_gives_the_same_intervals() -> None:
    probabilities, gold = miscalibrated()
    first = evaluate(probabilities, gold, resamples=200, seed=3)
    assert evaluate(probabilities, gold, resamples=200, seed=3) == first
    assert evaluate(probabilities, gold, resamples=200, seed=4) != first
    labels = ["a", "b", "c"]
    assert per_label(probabilities, gold, labels, resamples=100, seed=3) == per_label(
        probabilities, gold, labels, resamples=100, seed=3
    )


def test_a_wider_level_gives_a_wider_interval() -> None:
    probabilities, gold = miscalibrated()
    narrow = evaluate(probabilities, gold, resamples=300, level=0.5).accuracy
    wide = evaluate(probabilities, gold, resamples=300, level=0.99).accuracy
    assert wide.low < narrow.low < narrow.high < wide.high


def test_always_right_has_a_zero_width_accuracy_interval() -> None:
    probabilities = np.array([[0.8, 0.2], [0.3, 0.7], [0.9, 0.1]] * 10)
    gold = np.array([0, 1, 0] * 10)
    m = evaluate(probabilities, gold, resamples=200)
    assert m.accuracy == Interval(1.0, 1.0, 1.0)
    assert m.aurc == Interval(0.0, 0.0, 0.0)


def test_no_resamples_means_no_interval() -> None:
    m = evaluate(CASE_A, GOLD_A, resamples=0)
    for name in SCALARS:
        interval = getattr(m, name)
        assert interval.low == interval.value == interval.high


def test_each_resample_is_the_metrics_of_the_resampled_items(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The count-based bootstrap equals evaluating the resampled items themselves."""
    rng = np.random.default_rng(11)
    n = 40
    probabilities = rng.dirichlet([1.0, 1.0, 1.0], size=n)
    # Items already in ranking order, so that the resample counts index them directly.
    probabilities = probabilities[np.argsort(-probabilities.max(axis=1), kind="stable")]
    gold = rng.integers(0, 3, n)
    for _ in range(10):
        drawn = np.sort(rng.integers(0, n, n))
        counts = np.bincount(drawn, minlength=n).astype(np.float64)[np.newaxis]

        def one_resample(*_: object, counts: np.ndarray = counts) -> Iterator[np.ndarray]:
            yield counts

        monkeypatch.setattr(bootstrap, "resample_counts", one_resample)
        replica = evaluate(probabilities, gold, bins=4, resamples=1)
        direct = evaluate(probabilities[drawn], gold[drawn], bins=4, resamples=0)
        for name in SCALARS:
            # With one resample the interval collapses onto it.
            assert getattr(replica, name).low == pytest.approx(
                getattr(direct, name).value, rel=1e-9, abs=1e-12
            ), name


def test_a_large_input_is_quick_enough() -> None:
    # n = 20,000 at 200 resamples: the same work per resample as the 1e5 target, a tenth of it.
    rng = np.random.default_rng(5)
    probabilities = rng.dirichlet([1.0] * 4, size=20_000)
    gold = rng.integers(0, 4, 20_000)
    m = evaluate(probabilities, gold, resamples=200)
    assert m.count == 20_000
    assert m.accuracy.low <= m.accuracy.value <= m.accuracy.high


# --- order sensitivity ---------------------------------------------------------------------


def test_order_sensitivity_by_hand() -> None:
    rotations = np.array(
        [
            # Item 0: argmax 0 in every order, no flip. Per option max - min:
            # 0.6 - 0.5 = 0.1, 0.3 - 0.1 = 0.2, 0.3 - 0.2 = 0.1 -> change 0.2.
            [[0.5, 0.3, 0.2], [0.6, 0.1, 0.3], [0.5, 0.2, 0.3]],
            # Item 1: argmax 1, 0 (tie to the first), 2: a flip. 0.2, 0.2, 0.3 -> change 0.3.
            [[0.2, 0.5, 0.3], [0.4, 0.4, 0.2], [0.2, 0.3, 0.5]],
        ]
    )
    result = order_sensitivity(rotations)
    assert (result.items, result.rotations) == (2, 3)
    assert result.flip_rate == 0.5
    assert result.mean_change == approx(0.25)
    assert result.max_change == approx(0.3)


def test_order_sensitivity_of_identical_orders_is_zero() -> None:
    result = order_sensitivity(np.repeat(CASE_B[:, np.newaxis, :], 4, axis=1))
    assert (result.flip_rate, result.mean_change, result.max_change) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize(
    ("rotations", "message"),
    [
        (np.ones((2, 2)) / 2, r"shape \(n, r, k\)"),
        (np.ones((0, 2, 2)) / 2, "no items"),
        (np.ones((2, 1, 2)) / 2, "at least 2 orders"),
        (np.ones((2, 2, 1)), "at least 2 options"),
        (np.full((2, 2, 2), 0.4), "sums to"),
        (np.array([[[1.5, -0.5], [0.5, 0.5]]]), "negative"),
        (np.array([[[np.nan, 0.5], [0.5, 0.5]]]), "non-finite"),
    ],
)
def test_order_sensitivity_refuses_bad_input(rotations: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        order_sensitivity(rotations)


# --- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("probabilities", "gold", "message"),
    [
        ([0.5, 0.5], [0], r"shape \(n, k\)"),
        ([[0.5, 0.5]], [[0]], r"shape \(n,\)"),
        ([[0.5, 0.5]], [0, 1], "gold has 2 items but probabilities has 1 rows"),
        (np.zeros((0, 2)), np.zeros(0, dtype=int), "no items"),
        ([[1.0], [1.0]], [0, 0], "at least 2 options"),
        ([[0.5, 0.5]], [0.0], "integer option indices"),
        ([[0.5, 0.5]], [True], "integer option indices"),
        ([[0.5, 0.5], [0.5, 0.5]], [0, 2], r"gold\[1\] = 2 is not an option index"),
        ([[0.5, 0.5]], [-1], r"gold\[0\] = -1"),
        ([[0.5, 0.5], [0.5, 0.4]], [0, 0], "row 1 sums to 0.9"),
        ([[1.2, -0.2]], [0], "negative"),
        ([[np.nan, 1.0]], [0], "non-finite"),
        ([[np.inf, 0.0]], [0], "non-finite"),
    ],
)
def test_bad_input_is_refused(probabilities: Any, gold: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        evaluate(probabilities, gold)
    with pytest.raises(ValueError, match=message):
        per_label(probabilities, gold, ["a", "b"])


def test_a_sum_within_the_tolerance_is_accepted() -> None:
    assert point([[0.5, 0.5 + 5e-7]], [0]).count == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"bins": 0}, "bins"),
        ({"resamples": -1}, "resamples"),
        ({"level": 1.0}, "level"),
        ({"level": 0.0}, "level"),
    ],
)
def test_bad_options_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        evaluate(CASE_A, GOLD_A, **options)


# --- JSON ----------------------------------------------------------------------------------


def plain(value: Any) -> None:
    """Only JSON's own Python types, all the way down; floats finite."""
    if isinstance(value, dict):
        for key, item in value.items():
            assert type(key) is str
            plain(item)
    elif isinstance(value, list):
        for item in value:
            plain(item)
    else:
        assert value is None or type(value) in (bool, int, float, str), (type(value), value)
        if type(value) is float:
            assert math.isfinite(value)


def test_everything_converts_to_plain_json() -> None:
    probabilities, gold = miscalibrated(60)
    document = {
        "metrics": evaluate(probabilities, gold, resamples=20).to_json(),
        "per_label": {
            label: each.to_json()
            for label, each in per_label(probabilities, gold, ["a", "b", "c"], resamples=20).items()
        },
        "order": order_sensitivity(np.stack([probabilities, probabilities], axis=1)).to_json(),
    }
    plain(document)
    assert document["metrics"]["accuracy"].keys() == {"value", "low", "high"}
    assert len(document["metrics"]["selective"]) == 10
