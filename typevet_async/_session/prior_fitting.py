"""Fitting a prior from unlabelled states (`Session.fit_prior`): every state judged through
`judge_many`, each question's answers summed as they come (bounded memory however many
states), the batch prior taken at the end (`typevet_async._core.statistics.batch_calibration`:
its floor, skipped with the reason) and pinned to what decided the reads."""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Mapping, Sequence

from typevet_async._core.prompts.questions import Question
from typevet_async._core.statistics.batch_calibration import RunningPrior
from typevet_async._core.statistics.calibration import Pins, Reading, question_hash
from typevet_async._core.statistics.fitted_prior import FittedPrior, QuestionPrior
from typevet_async._session.batch import BatchStream

__all__ = ["fitted_prior"]


async def fitted_prior(
    stream: BatchStream,
    questions: Sequence[tuple[str, Question]],
    readings: Mapping[str, Reading],
    pins: Pins,
) -> FittedPrior:
    """The prior of ``questions`` over every judgment of ``stream`` (a `judge_many` stream
    that fails fast: a record's error is raised, not averaged over), read as ``readings`` say,
    pinned to ``pins``."""
    running = {qid: RunningPrior(options=len(question.options())) for qid, question in questions}
    async with contextlib.aclosing(stream):
        async for item in stream:
            assert item.judgment is not None  # fail_fast: an error item is raised
            for question_id, sums in running.items():
                sums.add(tuple(item.judgment[question_id].probabilities.values()))
    created = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    entries = {
        qid: QuestionPrior(question_hash(question), readings[qid], running[qid].prior())
        for qid, question in questions
    }
    return FittedPrior(pins, entries, created)
