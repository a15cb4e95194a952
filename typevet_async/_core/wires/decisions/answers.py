"""The client's side of the Decisions wire: typed questions as a request body, and a server's
answers (a list in question order) checked and rebuilt as typed answers.

Each question is sent with its id as its ``name``; a Choice's labels are sent as string
values, a Score's levels as ``{"label": level}``. Answers are checked by the System One rule
(`typevet_async._core.wires.system_one.answers_from_system_one`: a distribution over exactly the
question's options, within what rounding explains), the one owner of how far a server's
answer may be off.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from typevet_async._core.prompts.questions import Choice, Noul, Question
from typevet_async._core.reading.answers import Answer
from typevet_async._core.wires.jsonvalues import render_state
from typevet_async._core.wires.system_one import SystemOneAnswer, answers_from_system_one
from typevet_async._errors import ProtocolError, QuestionError

__all__ = ["DecisionsAnswer", "answers_from_decisions", "request_to_decisions"]


def _question(question_id: str, question: Question) -> dict[str, Any]:
    if question.examples:  # the Decisions wire has no field for them: never dropped silently
        error = QuestionError(
            "a Decisions question carries no examples (the API has no field for them); ask it "
            "without examples, or through System One to a server that reads them"
        )
        error.question_id = question_id
        raise error
    if isinstance(question, Noul):
        if question.criteria:
            error = QuestionError(
                "a Decisions predicate has only instructions: put the Noul's criteria in them"
            )
            error.question_id = question_id
            raise error
        return {"type": "predicate", "name": question_id, "instructions": question.instructions}
    if isinstance(question, Choice):
        choices = [
            {"value": option.label}
            | ({"description": option.description} if option.description else {})
            for option in question.options()
        ]
        return {
            "type": "choice",
            "name": question_id,
            "instructions": question.instructions,
            "choices": choices,
        }
    return {
        "type": "score",
        "name": question_id,
        "instructions": question.instructions,
        "levels": [{"label": level} for level in question.levels],
    }


def _input(state: Any) -> Any:
    """The state as ``input``: a string as it is; an object or a list of objects as one user
    message's ``input_json`` part (the server renders it as the SDK would); any other JSON
    value as its compact JSON text."""
    if isinstance(state, str):
        return state
    if isinstance(state, dict) or (
        isinstance(state, list) and state and all(isinstance(item, dict) for item in state)
    ):
        return [{"role": "user", "content": [{"type": "input_json", "data": state}]}]
    return render_state(state)


def request_to_decisions(
    model: str, state: Any, questions: Sequence[tuple[str, Question]]
) -> dict[str, Any]:
    """The Decisions request for ``questions`` about ``state``.

    :raises QuestionError: a Noul with criteria (a predicate carries none), or a question with
        examples (nothing is sent).
    """
    return {
        "model": model,
        "input": _input(state),
        "questions": [_question(qid, question) for qid, question in questions],
    }


@attrs.frozen
class DecisionsAnswer:
    """One answer as a Decisions server sent it (types checked by the backend's decoder)."""

    kind: str
    name: str | None
    #: A predicate's probability; a Choice's ``(value, p)`` and a Score's ``(label, p)`` pairs.
    probability: float | None = None
    probabilities: tuple[tuple[Any, float], ...] = ()
    choice: Any = None
    score: float | None = None
    confidence: float | None = None
    #: A Score's first level's ``value`` (its other values follow it one by one).
    first_level: int = 0


_KIND: dict[type, str] = {Noul: "predicate", Choice: "choice"}


def _sent(question_id: str, question: Question, sent: DecisionsAnswer) -> SystemOneAnswer:
    kind = _KIND.get(type(question), "score")
    if sent.kind != kind or sent.name not in (question_id, None):
        raise ProtocolError(
            f"/v1/decisions: answer {question_id!r}: a {sent.kind} answer named {sent.name!r} "
            f"where the {kind} question {question_id!r} was asked"
        )
    if sent.probability is not None:
        return SystemOneAnswer("noul", {"false": 1.0 - sent.probability, "true": sent.probability})
    if any(not isinstance(key, str) for key, _ in sent.probabilities):
        raise ProtocolError(f"/v1/decisions: answer {question_id!r}: a value not sent")
    if kind == "choice":
        return SystemOneAnswer(
            "choice", dict(sent.probabilities), choice=sent.choice, confidence=sent.confidence
        )
    levels = {level: str(n) for n, level in enumerate(getattr(question, "levels", ()))}
    by_level = {levels.get(label, label): p for label, p in sent.probabilities}
    score = None if sent.score is None else sent.score - sent.first_level
    return SystemOneAnswer("score", by_level, score=score, confidence=sent.confidence)


def answers_from_decisions(
    questions: Sequence[tuple[str, Question]], sent: Sequence[DecisionsAnswer]
) -> tuple[dict[str, Answer], tuple[str, ...]]:
    """The typed answers to ``questions`` from a Decisions response's answers (in question
    order), and the ids of the questions refused.

    :raises ProtocolError: as many answers as questions were not sent, or one is of another
        type or name, or fails the System One answer check.
    """
    if len(sent) != len(questions):
        raise ProtocolError(f"/v1/decisions: {len(sent)} answers to {len(questions)} questions")
    refused = tuple(
        qid for (qid, _), answer in zip(questions, sent, strict=True) if answer.kind == "refusal"
    )
    answered = [(qid, q) for qid, q in questions if qid not in refused]
    by_id = {
        qid: _sent(qid, question, answer)
        for (qid, question), answer in zip(questions, sent, strict=True)
        if answer.kind != "refusal"
    }
    return answers_from_system_one(answered, by_id), refused
