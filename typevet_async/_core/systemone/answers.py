"""A System One server's answers checked and rebuilt as typed answers: a distribution over
exactly the question's options, agreeing with the ``choice`` or ``score`` it names."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Final

import attrs

from typevet_async._core.answers import Answer, ChoiceAnswer, ScoreAnswer, build_answer
from typevet_async._core.questions import Choice, Noul, Question
from typevet_async._errors import ProtocolError

__all__ = ["SYSTEM_ONE_SLACK", "SystemOneAnswer", "answers_from_system_one"]

#: How far a System One answer's probabilities may sum from 1, and its expected score from the
#: one its probabilities give: JSON floats of a float32 softmax (our own gateway's are within
#: 1e-6). Anything further is not the distribution the answer claims to be.
SYSTEM_ONE_SLACK: Final = 1e-3


@attrs.frozen
class SystemOneAnswer:
    """One answer as a System One server sent it (types checked by the backend's decoder).

    ``probabilities`` is keyed as on the wire: ``"false"``/``"true"`` for a Noul (built from
    ``noul``), labels for a Choice, ``"0"``, ``"1"``, ... for a Score.
    """

    kind: str
    probabilities: Mapping[str, float]
    #: A Choice's ``choice``; a Score's ``score`` (its expected level).
    choice: str | None = None
    score: float | None = None


def _refused(question_id: str, message: str) -> ProtocolError:
    error = ProtocolError(f"/v1/systemone: answer {question_id!r}: {message}")
    error.question_id = question_id
    return error


def _answer_from_system_one(question_id: str, question: Question, sent: SystemOneAnswer) -> Answer:
    kind = (
        "noul"
        if isinstance(question, Noul)
        else "choice"
        if isinstance(question, Choice)
        else "score"
    )
    if sent.kind != kind:
        raise _refused(question_id, f"a {sent.kind} answer to a {kind} question")
    keys = (
        ["false", "true"]
        if isinstance(question, Noul)
        else list(question.labels)
        if isinstance(question, Choice)
        else [str(level) for level in range(len(question.levels))]
    )
    if set(sent.probabilities) != set(keys):
        raise _refused(
            question_id,
            f"probabilities keyed {sorted(sent.probabilities)}, the question's options are {keys}",
        )
    probabilities = [sent.probabilities[key] for key in keys]
    total = math.fsum(probabilities)
    if abs(total - 1.0) > SYSTEM_ONE_SLACK:
        raise _refused(question_id, f"probabilities sum to {total:.6g}, not 1")
    answer = build_answer(question, probabilities)
    if isinstance(answer, ChoiceAnswer):
        if sent.choice is None or sent.choice not in sent.probabilities:
            raise _refused(question_id, f"choice {sent.choice!r} is not one of the labels")
        if sent.probabilities[sent.choice] < max(probabilities) - SYSTEM_ONE_SLACK:
            raise _refused(question_id, f"choice {sent.choice!r} is not the most probable label")
    if isinstance(answer, ScoreAnswer) and (
        sent.score is None or abs(sent.score - answer.score) > SYSTEM_ONE_SLACK
    ):
        raise _refused(
            question_id,
            f"score {sent.score!r} is not the expected level of its probabilities "
            f"({answer.score:.6g})",
        )
    return answer


def answers_from_system_one(
    questions: Sequence[tuple[str, Question]], sent: Mapping[str, SystemOneAnswer]
) -> dict[str, Answer]:
    """The typed answers to ``questions`` (in their order) from a System One response's.

    Each answer is rebuilt from the probabilities the server sent, by the rules every backend
    shares (`build_answer`: the confidence is ours, the Choice's label the most probable), once
    they are shown to be a distribution over exactly the question's options that agrees with
    the ``choice`` or ``score`` the server named. A Noul's probabilities are ``1 - noul`` and
    ``noul``.

    :raises ProtocolError: an answer missing, extra or of another type, keyed otherwise than the
        question's options, not summing to 1, or disagreeing with itself (``question_id`` names
        the question).
    """
    asked = [question_id for question_id, _ in questions]
    extra = [question_id for question_id in sent if question_id not in set(asked)]
    if extra:
        raise ProtocolError(f"/v1/systemone: answers to questions not asked: {extra}")
    answers: dict[str, Answer] = {}
    for question_id, question in questions:
        if question_id not in sent:
            raise _refused(question_id, "missing from the response")
        answers[question_id] = _answer_from_system_one(question_id, question, sent[question_id])
    return answers
