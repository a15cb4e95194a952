"""Batch calibration (Zhou et al., "Batch Calibration: Rethinking Calibration for In-Context
Learning and Prompt Engineering", ICLR 2024).

A small model's answers lean towards some options whatever the state says. Batch calibration
estimates that lean, the question's contextual prior, as the mean of the model's option
probabilities over a batch of the caller's own unlabelled states, and divides it out of each
answer (renormalised): no labels, no content-free states, no extra reads.

It cannot help where the batch says nothing about the lean, and must not divide by noise there:

- a batch of fewer answers than `min_batch_items` asks for the question's option count: at
  least `MIN_BATCH_ITEMS`, and `ITEMS_PER_OPTION` per option (one answer divided by itself would
  come out uniform whatever it said, and a batch that has not seen each option a few times
  divides by an estimate of the lean noisier than the lean);
- a batch whose answers to the question do not vary (every option's probability within
  `MIN_SPREAD` of its mean across the batch): the mean is then each answer itself.

In both cases the answers stand as read and `BatchPrior.skipped` says why. Pure arithmetic: the
session gathers the answers (`typevet_async._session`) and keeps a fitted prior.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

import attrs

from typevet_async._core.prompts.questions import Question
from typevet_async._core.reading.answers import Answer, Diagnostics, build_answer
from typevet_async._core.statistics.content_free import divide_prior
from typevet_async._errors import InvalidLogprobsError

__all__ = [
    "ITEMS_PER_OPTION",
    "MIN_BATCH_ITEMS",
    "MIN_SPREAD",
    "BatchPrior",
    "RunningPrior",
    "apply_batch_prior",
    "batch_prior",
    "min_batch_items",
]

#: The fewest answers a batch prior is estimated from, whatever the option count. Measured on
#: the real model over random orders of public data's dev halves, a two-option question's
#: batch of 8 still lost log loss on average; from about 14 it no longer did.
MIN_BATCH_ITEMS: Final = 16

#: The fewest answers per option: a 14-option question's batches of 10 and 14 lost log loss on
#: average, of 20 broke even and of 28 gained (the same measurement).
ITEMS_PER_OPTION: Final = 2

#: The least spread (largest standard deviation over the options of one option's probability
#: across the batch) under which the batch is said not to vary the question's answers.
MIN_SPREAD: Final = 0.01


def min_batch_items(options: int) -> int:
    """The floor: the fewest answers a batch prior of an ``options``-option question is
    estimated from."""
    return max(MIN_BATCH_ITEMS, ITEMS_PER_OPTION * options)


def _too_few(items: int, options: int) -> str | None:
    floor = min_batch_items(options)
    if items >= floor:
        return None
    return f"a batch of {items} answers (fewer than {floor} for {options} options)"


@attrs.frozen
class BatchPrior:
    """A question's batch prior: the mean of ``items`` answers' probabilities in option order,
    or None with the reason it was not estimated (``skipped``)."""

    probabilities: tuple[float, ...] | None
    items: int
    skipped: str | None = None


def _checked(distributions: Sequence[Sequence[float]]) -> int:
    options = len(distributions[0])
    for distribution in distributions:
        if len(distribution) != options:
            raise InvalidLogprobsError("batch answers of different option counts")
        if not all(math.isfinite(p) and 0.0 <= p <= 1.0 for p in distribution):
            raise InvalidLogprobsError(f"a batch answer is not a distribution: {distribution!r}")
    return options


def batch_prior(distributions: Sequence[Sequence[float]]) -> BatchPrior:
    """The batch prior of one question from its answers' probabilities (each in option order):
    their mean, or skipped (module docstring) when the batch is too small or does not vary.

    :raises InvalidLogprobsError: answers of different sizes, or a value that is not a finite
        probability.
    """
    items = len(distributions)
    if not items:
        return BatchPrior(None, 0, "a batch of 0 answers")
    options = _checked(distributions)
    too_few = _too_few(items, options)
    if too_few is not None:
        return BatchPrior(None, items, too_few)
    mean = tuple(math.fsum(d[i] for d in distributions) / items for i in range(options))
    spread = max(
        math.sqrt(math.fsum((d[i] - mean[i]) ** 2 for d in distributions) / items)
        for i in range(options)
    )
    if spread < MIN_SPREAD:
        return BatchPrior(None, items, f"the batch does not vary the answers (spread {spread:.2g})")
    return BatchPrior(mean, items)


@attrs.define
class RunningPrior:
    """A stream's batch prior, kept as running sums: bounded memory however long the stream.
    `prior` is `batch_prior` over every answer added so far, computed from the sums (Welford's
    sums of squares would be steadier, but the spread only gates, it divides nothing)."""

    options: int
    items: int = 0
    sums: list[float] = attrs.field(factory=list)
    squares: list[float] = attrs.field(factory=list)

    def add(self, probabilities: Sequence[float]) -> None:
        """Count one answer's probabilities (option order) in."""
        _checked([probabilities])
        if len(probabilities) != self.options:
            raise InvalidLogprobsError("batch answers of different option counts")
        if not self.sums:
            self.sums, self.squares = [0.0] * self.options, [0.0] * self.options
        for i, p in enumerate(probabilities):
            self.sums[i] += p
            self.squares[i] += p * p
        self.items += 1

    def prior(self) -> BatchPrior:
        """The prior over every answer added so far (skipped as `batch_prior` would be)."""
        too_few = _too_few(self.items, self.options)
        if too_few is not None:
            return BatchPrior(None, self.items, too_few)
        mean = tuple(total / self.items for total in self.sums)
        spread = max(
            math.sqrt(max(0.0, square / self.items - m * m))
            for square, m in zip(self.squares, mean, strict=True)
        )
        if spread < MIN_SPREAD:
            return BatchPrior(
                None, self.items, f"the batch does not vary the answers (spread {spread:.2g})"
            )
        return BatchPrior(mean, self.items)


def apply_batch_prior(
    question: Question, answer: Answer, diagnostics: Diagnostics, prior: BatchPrior
) -> tuple[Answer, Diagnostics]:
    """``answer`` with ``prior`` divided out (`divide_prior`), rebuilt for ``question``; the
    diagnostics keep the probabilities before it (``raw_probabilities``) and the prior. A
    skipped prior leaves the answer as read and says why in the diagnostics."""
    if prior.probabilities is None:
        return answer, attrs.evolve(
            diagnostics, batch_prior_items=prior.items, batch_prior_skipped=prior.skipped
        )
    probabilities = tuple(answer.probabilities.values())  # option order
    divided = divide_prior(probabilities, prior.probabilities)
    return build_answer(question, divided), attrs.evolve(
        diagnostics,
        raw_probabilities=diagnostics.raw_probabilities or probabilities,
        batch_prior=prior.probabilities,
        batch_prior_items=prior.items,
        batch_prior_skipped=None,  # divided now, whatever an earlier step said
    )
