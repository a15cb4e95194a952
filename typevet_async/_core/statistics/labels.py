"""Gold labels of a labelled record, as the evaluation reads them.

A labelled record is ``{"id": ..., "state": ..., "labels": {question id: gold}}``. A Noul's gold
is JSON ``true`` or ``false``; a Choice's is one of its labels; a Score's is its 0-based level
(an integer). A question missing from ``labels`` is not scored for that record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from typevet_async._core.prompts.questions import Choice, Noul, Question
from typevet_async._errors import InvalidInputError

__all__ = ["gold_indices", "labelled_record"]


def _gold_index(question_id: str, question: Question, value: Any) -> int:
    if isinstance(question, Noul):
        if isinstance(value, bool):
            return int(value)
        wanted = "true or false"
    elif isinstance(question, Choice):
        if isinstance(value, str) and value in question.labels:
            return question.labels.index(value)
        wanted = f"one of {list(question.labels)}"
    else:
        levels = len(question.levels)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < levels:
            return value
        wanted = f"an integer level from 0 to {levels - 1}"
    raise InvalidInputError(f"the label of {question_id!r} must be {wanted}, got {value!r}")


def gold_indices(
    labels: Mapping[str, Any], questions: Sequence[tuple[str, Question]]
) -> dict[str, int]:
    """Each labelled question's gold option index.

    :raises InvalidInputError: a label for a question not asked, or a value its question
        cannot have.
    """
    asked = dict(questions)
    unknown = sorted(set(labels) - set(asked))
    if unknown:
        raise InvalidInputError(f"labels for question(s) {unknown} that are not asked")
    return {
        question_id: _gold_index(question_id, asked[question_id], labels[question_id])
        for question_id, _ in questions
        if question_id in labels
    }


def labelled_record(data: Any) -> tuple[Any, Any, Mapping[str, Any]]:
    """A labelled record's id, state and labels.

    :raises InvalidInputError: not an object with ``id``, ``state`` and a ``labels`` object.
    """
    if not isinstance(data, dict) or not {"id", "state", "labels"} <= set(data):
        raise InvalidInputError('a labelled record is {"id": ..., "state": ..., "labels": {...}}')
    if not isinstance(data["labels"], dict):
        raise InvalidInputError(f"labels must be an object, got {data['labels']!r}")
    return data["id"], data["state"], data["labels"]
