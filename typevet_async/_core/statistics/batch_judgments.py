"""Batch calibration over judgments (the arithmetic is `batch_calibration`'s): the setting,
a batch's judgments divided question by question by its prior (`divide_batch`), a single
judgment marked as the batch of one it is (`alone`), and a stream's items (`StreamCalibration`).

How a batch is divided:

- **A finite batch** (``window`` None) is held whole: once every record is judged, each
  question's prior is the mean of its answers over the batch, divided out of each answer.
- **A stream** holds its first ``window`` records (the warm-up: its answers divided by their
  prior, as a finite batch of that size), then divides each later answer by the running
  prior over every answer so far, that answer included: memory bounded by the window.
  A stream that ends before its warm-up fills is divided as the finite batch it was.
- A record that failed (an error item) is not an answer: it passes through untouched, in its
  place, and counts for nothing.
- Where the prior cannot help (`batch_calibration`'s floor: fewer answers than
  `min_batch_items` asks for the question's options, a batch that does not vary them) the
  answers stand as read, and their diagnostics say why. A stream's question with more options
  than its warm-up can cover is left as read until its running count reaches the floor.

Pure: `Session.judge_many`'s stream and the gateway's batch route call it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, get_args

import attrs

from typevet_async._core.prompts.questions import Question
from typevet_async._core.reading.answers import Answer, Diagnostics, Judgment
from typevet_async._core.reading.batch_records import BatchItem
from typevet_async._core.statistics.batch_calibration import (
    MIN_BATCH_ITEMS,
    BatchPrior,
    RunningPrior,
    apply_batch_prior,
    batch_prior,
)
from typevet_async._errors import ConfigurationError

__all__ = [
    "ALONE",
    "DEFAULT_BATCH_CALIBRATION",
    "DEFAULT_WINDOW",
    "BatchCalibration",
    "StreamCalibration",
    "alone",
    "batch_calibration_setting",
    "calibration_window",
    "divide_batch",
]

#: Whether `judge_many` divides out each question's batch prior.
BatchCalibration = Literal["off", "on"]
DEFAULT_BATCH_CALIBRATION: Final[BatchCalibration] = "off"
#: A stream's warm-up: the answers held before the first is divided (about three times the
#: floor, so one odd state moves the first prior by a thirty-second, not an eighth).
DEFAULT_WINDOW: Final = 32
#: Why a single judgment is left as read.
ALONE: Final = "a single judgment is a batch of one (judge_many divides a batch's answers)"


def batch_calibration_setting(value: Any) -> BatchCalibration:
    """A ``batch_calibration`` setting: ``"off"`` or ``"on"``; False and True are those.

    :raises ConfigurationError: any other value.
    """
    if value is True or value is False:
        return "on" if value else "off"
    if isinstance(value, str) and value in get_args(BatchCalibration):
        return value  # type: ignore[return-value]
    raise ConfigurationError(f"batch_calibration must be 'off', 'on', True or False, got {value!r}")


def calibration_window(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """A stream's warm-up: a whole number of answers, at least the floor."""
    if isinstance(value, bool) or not isinstance(value, int) or value < MIN_BATCH_ITEMS:
        raise ConfigurationError(
            f"{attribute.name} must be an integer >= {MIN_BATCH_ITEMS} (the fewest answers a "
            f"batch prior is estimated from), got {value!r}"
        )


def alone(judgment: Judgment) -> Judgment:
    """``judgment`` as read, its diagnostics saying it was a batch of one (`ALONE`)."""
    return attrs.evolve(
        judgment,
        diagnostics={
            question_id: attrs.evolve(diagnostics, batch_prior_items=1, batch_prior_skipped=ALONE)
            for question_id, diagnostics in judgment.diagnostics.items()
        },
    )


def _probabilities(judgment: Judgment, question_id: str) -> tuple[float, ...]:
    return tuple(judgment.answers[question_id].probabilities.values())  # option order


def _divided(
    questions: Sequence[tuple[str, Question]], judgment: Judgment, priors: Mapping[str, BatchPrior]
) -> Judgment:
    answers: dict[str, Answer] = dict(judgment.answers)
    diagnostics: dict[str, Diagnostics] = dict(judgment.diagnostics)
    for question_id, question in questions:
        answers[question_id], diagnostics[question_id] = apply_batch_prior(
            question, answers[question_id], diagnostics[question_id], priors[question_id]
        )
    return Judgment(answers, judgment.usage, diagnostics)


def divide_batch(
    questions: Sequence[tuple[str, Question]], judgments: Sequence[Judgment]
) -> list[Judgment]:
    """Each of ``judgments`` (one batch's, every one answering ``questions``) divided by each
    question's batch prior over them all (`batch_prior`; skipped below its floor), in order.

    :raises InvalidLogprobsError: an answer that is not a distribution.
    """
    priors = {
        question_id: batch_prior([_probabilities(j, question_id) for j in judgments])
        for question_id, _ in questions
    }
    return [_divided(questions, judgment, priors) for judgment in judgments]


class StreamCalibration:
    """A `judge_many` stream's items divided as they come (module docstring): `take` each item
    in the order the caller yields them and yield what it gives back; `finish` at the end of
    the input gives back whatever is still held. ``window`` None: a finite batch, held whole.
    """

    def __init__(self, questions: Sequence[tuple[str, Question]], window: int | None) -> None:
        self.questions = tuple(questions)
        self.window = window
        #: The warm-up's items (error items too, to keep their places) until it is released.
        self.held: list[BatchItem] = []
        self.warming = True
        self.running: dict[str, RunningPrior] = {}

    def take(self, item: BatchItem) -> list[BatchItem]:
        """The items ready to yield once ``item`` is in (none while the warm-up holds)."""
        judgment = item.judgment
        if judgment is not None:
            self._count(judgment)
        if self.warming:
            self.held.append(item)
            if self.window is not None and len(self.held) >= self.window:
                return self.finish()
            return []
        if judgment is None:
            return [item]
        priors = {qid: running.prior() for qid, running in self.running.items()}
        return [attrs.evolve(item, judgment=_divided(self.questions, judgment, priors))]

    def finish(self) -> list[BatchItem]:
        """The warm-up's items, divided by its prior (the whole batch's, if it never filled)."""
        if not self.warming:
            return []
        self.warming = False
        held, self.held = self.held, []
        answered = [item.judgment for item in held if item.judgment is not None]
        divided = iter(divide_batch(self.questions, answered))
        return [
            item if item.judgment is None else attrs.evolve(item, judgment=next(divided))
            for item in held
        ]

    def _count(self, judgment: Judgment) -> None:
        """``judgment``'s answers into each question's running prior (after the warm-up, the
        prior each later answer is divided by)."""
        if self.window is None:
            return  # a finite batch is divided whole: no running prior
        for question_id, question in self.questions:
            running = self.running.get(question_id)
            if running is None:
                running = self.running[question_id] = RunningPrior(len(question.options()))
            running.add(_probabilities(judgment, question_id))
