"""System One's questions, both ways: a question's JSON (``{"type", "instructions"?,
"criteria"?}``) as a typed `Question`, and back; structured instructions and criteria (a
string as it is, an object or array as compact JSON, keys in the order given) as prompt text."""

from __future__ import annotations

import warnings
from typing import Any, Final

from typevet_async._core.jsonvalues import compact_json
from typevet_async._core.questions import Choice, Noul, Question, Score
from typevet_async._errors import QuestionError, TypevetError

__all__ = [
    "EXTENSION",
    "NOUL_DEFAULT_INSTRUCTIONS",
    "UnsupportedQuestionError",
    "question_from_system_one",
    "question_to_system_one",
    "questions_from_system_one",
    "render_structured",
]

#: The response field our richer record rides in: ``x_``-prefixed, as System One reserves for
#: extensions (gateways before issue 33 sent it as ``typevet``; the client reads both).
EXTENSION: Final = "x_typevet"

#: What a Noul sent without instructions (System One allows it: its criteria may say it all)
#: is asked; its option lines, "Yes" and "No" with their criteria, follow it in the prompt.
NOUL_DEFAULT_INSTRUCTIONS: Final = "Which of these holds: yes or no?"

_IMAGE_FORMATS: Final = {"png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg"}


class UnsupportedQuestionError(QuestionError):
    """A question of a type System One has that this server does not answer (``box``): the
    422's entry says ``"type": "unsupported"``."""


def render_structured(value: Any, what: str) -> str | None:
    """Instructions or a criterion as prompt text: a string as is, None as None, an object or
    array as compact JSON (keys in the order given).

    :raises QuestionError: a value that is none of these (``what`` names it).
    """
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        try:
            return compact_json(value)
        except TypevetError as error:
            raise QuestionError(f"{what}: {error}") from None
    raise QuestionError(f"{what} must be a string, an object or an array, got {value!r}")


def question_from_system_one(data: Any, question_id: str) -> Question:
    """One System One question.

    A Score's levels are its ``criteria`` (a list); the old ``levels`` key is still read, with a
    `DeprecationWarning`.

    :raises QuestionError: not a question of a supported type (``question_id`` names it).
    """
    try:
        if not isinstance(data, dict):
            raise QuestionError(f"a question must be a JSON object, got {data!r}")
        kind = data.get("type")
        instructions = render_structured(data.get("instructions"), "instructions")
        criteria = data.get("criteria")
        if kind == "noul":
            if criteria is not None and not isinstance(criteria, dict):
                raise QuestionError(f"a Noul's criteria must be an object, got {criteria!r}")
            rendered = (
                None
                if criteria is None
                else {k: render_structured(v, f"criteria[{k!r}]") for k, v in criteria.items()}
            )
            if instructions is None:  # absent or null; an empty string is still refused
                instructions = NOUL_DEFAULT_INSTRUCTIONS
            return Noul(instructions=instructions, criteria=rendered)
        if kind == "choice":
            if isinstance(criteria, dict):
                criteria = {
                    name: render_structured(text, f"criteria[{name!r}]")
                    for name, text in criteria.items()
                }
            return Choice(criteria, instructions=instructions)
        if kind == "score":
            if criteria is None and "levels" in data:
                warnings.warn(
                    f"question {question_id!r}: a Score's 'levels' is the old form; System One "
                    "puts a Score's levels in 'criteria' (a list)",
                    DeprecationWarning,
                    stacklevel=3,
                )
                criteria = data["levels"]
            if not isinstance(criteria, list):
                raise QuestionError(f"a Score's criteria must be a list, got {criteria!r}")
            levels = [
                render_structured(level, f"criteria[{n}]") for n, level in enumerate(criteria)
            ]
            return Score(levels, instructions=instructions)
        if kind == "box":
            raise UnsupportedQuestionError(
                "box questions are not supported: no model here locates boxes"
            )
        raise QuestionError(f"type must be 'noul', 'choice' or 'score', got {kind!r}")
    except QuestionError as error:
        error.question_id = question_id
        raise


def questions_from_system_one(data: Any) -> dict[str, Question]:
    """The ``questions`` object (or a request holding one) to questions, in order."""
    if isinstance(data, dict) and isinstance(data.get("questions"), dict):
        data = data["questions"]
    if not isinstance(data, dict) or not data:
        raise QuestionError("questions must be a non-empty JSON object of id to question")
    return {str(qid): question_from_system_one(item, str(qid)) for qid, item in data.items()}


def question_to_system_one(question: Question) -> dict[str, Any]:
    """A question as System One sends it."""
    if isinstance(question, Noul):
        criteria = {o.label: o.description for o in question.options() if o.description}
        body: dict[str, Any] = {"type": "noul", "instructions": question.instructions}
        if criteria:
            body["criteria"] = criteria
        return body
    if isinstance(question, Choice):
        return {
            "type": "choice",
            "instructions": question.instructions,
            "criteria": {o.label: o.description for o in question.options()},
        }
    return {
        "type": "score",
        "instructions": question.instructions,
        "criteria": list(question.levels),
    }
