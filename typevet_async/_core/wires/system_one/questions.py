"""System One's questions, both ways: a question's JSON (``{"type", "instructions"?,
"criteria"?, "x_examples"?}``) as a typed `Question`, and back; structured instructions and
criteria (a string as it is, an object or array as compact JSON, keys in the order given) as
prompt text.

A question's in-context examples ride in `EXAMPLES_FIELD` (an extension, ``x_``-prefixed as
System One reserves), each ``{"state": text, "answer": ...}``: a Noul's ``true``/``false``, a
Choice's label, a Score's level (0-based). A server that reads them says so in ``GET
/v1/models`` (`EXAMPLES_ADVERTISEMENT`); a client sends them only to one that does, since any
other System One server ignores the field and would answer without them."""

from __future__ import annotations

import warnings
from typing import Any, Final

from typevet_async._core.prompts.questions import (
    MAX_EXAMPLES,
    Choice,
    Noul,
    Question,
    Score,
    example_answer,
)
from typevet_async._core.wires.jsonvalues import compact_json
from typevet_async._errors import QuestionError, TypevetError

__all__ = [
    "EXAMPLES_ADVERTISEMENT",
    "EXAMPLES_FIELD",
    "EXTENSION",
    "NOUL_DEFAULT_INSTRUCTIONS",
    "UnsupportedQuestionError",
    "examples_advertisement",
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

#: A question's examples on the wire: ``[{"state": text, "answer": ...}, ...]``.
EXAMPLES_FIELD: Final = "x_examples"
#: The ``GET /v1/models`` field of a server that reads `EXAMPLES_FIELD`
#: (`examples_advertisement`).
EXAMPLES_ADVERTISEMENT: Final = "x_question_examples"

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


def examples_advertisement() -> dict[str, Any]:
    """The `EXAMPLES_ADVERTISEMENT` field's value: the question field read, and its cap."""
    return {"field": EXAMPLES_FIELD, "max_examples": MAX_EXAMPLES}


def _examples_from_system_one(raw: Any) -> list[tuple[Any, Any]] | None:
    """`EXAMPLES_FIELD` as (state, answer) pairs for the question's own checks (its cap and
    its answers' types are the question's rules; None: absent).

    :raises QuestionError: not an array of ``{"state", "answer"}`` objects.
    """
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise QuestionError(
            f'{EXAMPLES_FIELD} must be an array of {{"state", "answer"}} objects, got {raw!r}'
        )
    pairs: list[tuple[Any, Any]] = []
    for index, item in enumerate(raw[: MAX_EXAMPLES + 1]):  # one past the cap: refused there
        if not isinstance(item, dict) or set(item) != {"state", "answer"}:
            raise QuestionError(
                f'{EXAMPLES_FIELD}[{index}] must be an object of exactly "state" and '
                f'"answer", got {item!r}'
            )
        pairs.append((item["state"], item["answer"]))
    return pairs


def _examples_to_system_one(question: Question) -> list[dict[str, Any]]:
    """A question's examples as `EXAMPLES_FIELD` carries them (the answers as the caller gave
    them: `example_answer`)."""
    return [
        {"state": state, "answer": example_answer(question, label)}
        for state, label in question.examples
    ]


def question_from_system_one(data: Any, question_id: str) -> Question:
    """One System One question.

    A Score's levels are its ``criteria`` (a list); the old ``levels`` key is still read, with a
    `DeprecationWarning`. Examples are read from `EXAMPLES_FIELD`.

    :raises QuestionError: not a question of a supported type (``question_id`` names it).
    """
    try:
        if not isinstance(data, dict):
            raise QuestionError(f"a question must be a JSON object, got {data!r}")
        kind = data.get("type")
        instructions = render_structured(data.get("instructions"), "instructions")
        criteria = data.get("criteria")
        examples = _examples_from_system_one(data.get(EXAMPLES_FIELD))
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
            return Noul(instructions=instructions, criteria=rendered, examples=examples)
        if kind == "choice":
            if isinstance(criteria, dict):
                criteria = {
                    name: render_structured(text, f"criteria[{name!r}]")
                    for name, text in criteria.items()
                }
            return Choice(criteria, instructions=instructions, examples=examples)
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
            return Score(levels, instructions=instructions, examples=examples)
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
    """A question as System One sends it (its examples, if any, in `EXAMPLES_FIELD`)."""
    body: dict[str, Any]
    if isinstance(question, Noul):
        criteria = {o.label: o.description for o in question.options() if o.description}
        body = {"type": "noul", "instructions": question.instructions}
        if criteria:
            body["criteria"] = criteria
    elif isinstance(question, Choice):
        body = {
            "type": "choice",
            "instructions": question.instructions,
            "criteria": {o.label: o.description for o in question.options()},
        }
    else:
        body = {
            "type": "score",
            "instructions": question.instructions,
            "criteria": list(question.levels),
        }
    if question.examples:
        body[EXAMPLES_FIELD] = _examples_to_system_one(question)
    return body
