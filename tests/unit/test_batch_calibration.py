"""Batch calibration's arithmetic against a hand computation, and where it refuses to divide."""

from __future__ import annotations

import math

import pytest

import typevet_async as tv
from typevet_async._core.reading.answers import Diagnostics, build_answer
from typevet_async._core.statistics.batch_calibration import (
    MIN_BATCH_ITEMS,
    RunningPrior,
    apply_batch_prior,
    batch_prior,
    min_batch_items,
)
from typevet_async._errors import InvalidLogprobsError

DIAGNOSTICS = Diagnostics(
    prompt="p",
    controls=("A", "B", "C"),
    token_ids=(1, 2, 3),
    logprobs=(-1.0, -2.0, -3.0),
    off_menu_mass=0.0,
    top_k=64,
    reads=1,
)
ROUTE = tv.Choice(["billing", "bug", "other"], instructions="Route it.")
#: Eight answers leaning to "billing" whatever they say, twice over: sixteen, the floor of a
#: three-option question.
EIGHT = [
    (0.7, 0.2, 0.1),
    (0.6, 0.3, 0.1),
    (0.8, 0.1, 0.1),
    (0.5, 0.4, 0.1),
    (0.4, 0.2, 0.4),
    (0.7, 0.1, 0.2),
    (0.6, 0.2, 0.2),
    (0.5, 0.1, 0.4),
]
BATCH = EIGHT * 2


def test_the_prior_is_the_batch_mean() -> None:
    prior = batch_prior(BATCH)
    assert prior.skipped is None
    assert prior.items == 16
    assert prior.probabilities == pytest.approx((4.8 / 8, 1.6 / 8, 1.6 / 8))


def test_an_answer_divided_by_the_prior_by_hand() -> None:
    prior = batch_prior(BATCH)
    answer = build_answer(ROUTE, BATCH[3])  # (0.5, 0.4, 0.1): "billing" as read
    divided, diagnostics = apply_batch_prior(ROUTE, answer, DIAGNOSTICS, prior)
    # 0.5/0.6, 0.4/0.2, 0.1/0.2 = 0.8333, 2.0, 0.5; their sum 3.3333
    weights = (0.5 / 0.6, 0.4 / 0.2, 0.1 / 0.2)
    expected = tuple(w / math.fsum(weights) for w in weights)
    assert tuple(divided.probabilities.values()) == pytest.approx(expected)
    assert divided.choice == "bug"  # the lean towards billing divided out
    assert diagnostics.raw_probabilities == BATCH[3]
    assert diagnostics.batch_prior == prior.probabilities
    assert diagnostics.batch_prior_items == 16
    assert diagnostics.batch_prior_skipped is None


def test_a_batch_too_small_is_not_divided() -> None:
    prior = batch_prior(BATCH[: MIN_BATCH_ITEMS - 1])
    assert prior.probabilities is None
    assert prior.skipped == "a batch of 15 answers (fewer than 16 for 3 options)"
    answer = build_answer(ROUTE, BATCH[0])
    same, diagnostics = apply_batch_prior(ROUTE, answer, DIAGNOSTICS, prior)
    assert same == answer
    assert diagnostics.batch_prior is None
    assert diagnostics.batch_prior_skipped == prior.skipped


def test_a_batch_that_does_not_vary_is_not_divided() -> None:
    prior = batch_prior([(0.7, 0.2, 0.1)] * 16 + [(0.705, 0.195, 0.1)] * 4)
    assert prior.probabilities is None
    assert "does not vary" in (prior.skipped or "")


def test_a_running_prior_equals_the_batch_prior() -> None:
    running = RunningPrior(options=3)
    for answer in BATCH[:5]:
        running.add(answer)
    assert running.prior().probabilities is None  # still warming up
    for answer in BATCH[5:]:
        running.add(answer)
    assert running.prior().probabilities == pytest.approx(batch_prior(BATCH).probabilities)
    assert running.prior().items == 16


def leaning_answers(options: int, count: int) -> list[tuple[float, ...]]:
    """``count`` answers to an ``options``-option question, each leaning to the first option
    and varying (its share of the rest moves from answer to answer)."""
    answers = []
    for n in range(count):
        first = 0.3 + 0.4 * (n % 5) / 4
        rest = [1.0 + (n + i) % 3 for i in range(options - 1)]
        answers.append((first, *((1 - first) * r / sum(rest) for r in rest)))
    return answers


def test_the_floor_grows_with_the_option_count() -> None:
    assert [min_batch_items(n) for n in (2, 3, 8, 14, 255)] == [16, 16, 16, 28, 510]
    # two options: sixteen answers are enough
    assert batch_prior(leaning_answers(2, 16)).probabilities is not None
    # fourteen options: twenty are not, twenty-eight are
    short = batch_prior(leaning_answers(14, 20))
    assert short.probabilities is None
    assert short.skipped == "a batch of 20 answers (fewer than 28 for 14 options)"
    assert batch_prior(leaning_answers(14, 28)).probabilities is not None
    running = RunningPrior(options=14)
    for answer in leaning_answers(14, 27):
        running.add(answer)
    assert running.prior().skipped == "a batch of 27 answers (fewer than 28 for 14 options)"
    running.add(leaning_answers(14, 28)[-1])
    assert running.prior().probabilities == pytest.approx(
        batch_prior(leaning_answers(14, 28)).probabilities
    )


def test_an_empty_batch_is_not_divided() -> None:
    assert batch_prior([]).skipped == "a batch of 0 answers"


def test_answers_that_are_no_distribution_are_refused() -> None:
    with pytest.raises(InvalidLogprobsError):
        batch_prior([*BATCH[:7], (0.5, float("nan"), 0.5)])
    with pytest.raises(InvalidLogprobsError):
        batch_prior([*BATCH[:7], (0.5, 0.5)])
