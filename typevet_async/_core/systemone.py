"""The System One wire (``POST /v1/systemone``), both directions: requests, responses, errors.

Shapes as the official client's models define them (``typesafe_sdk._schemas.models``):

- request ``{"model", "state", "questions", "assets"?}``: ``state`` a string, object or array;
  ``questions`` id -> ``{"type": "noul" | "choice" | "score", "instructions"?, "criteria"?}``
  (a Noul's criteria ``{"true"?, "false"?}``, a Choice's name -> description, a Score's an
  ordered list of level descriptions); ``assets`` placeholder -> ``{"type": "image",
  "format", "data_base64"}``.
- response ``{"model", "answers", "usage": {"input_tokens", "output_tokens"}}``, each answer
  the System One answer of its type. Our richer record rides along under ``"typevet"``
  (`EXTENSION`: our usage and each answer's diagnostics), which System One clients ignore.
- validation failure: HTTP 422 with ``{"detail": [{"loc", "msg", "type", "input", "ctx"}]}``.

**Structured text.** Instructions and criteria may be a string, an object or an array. A string
is used as it is; any other value is rendered as compact JSON, its keys in the order given,
non-ASCII kept (`render_structured`): the same value always gives the same prompt text. A
Score's legend in the response carries the criteria as they were sent.

**Usage.** ``input_tokens`` is the prompt tokens the server evaluated for every read, cached or
not (what a read costs); ``output_tokens`` is 0: no token is generated, each read is one
forward pass over the prompt.

**Assets.** Each image asset becomes an image of the judgment, in the order its placeholder
first appears (state, then each question's instructions and criteria); the placeholder text
itself is replaced by ``[image N]``. The SDK puts a judgment's images before its state, so an
image is not placed inline where its placeholder stood. An asset no placeholder uses is
refused, as is one sent as a multipart ``part`` (this wire reads JSON bodies).
"""

from __future__ import annotations

import base64
import binascii
import re
import warnings
from collections.abc import Mapping
from typing import Any, Final

import attrs

from typevet_async._core.answers import Answer, ChoiceAnswer, Judgment, NoulAnswer, ScoreAnswer
from typevet_async._core.jsonvalues import compact_json
from typevet_async._core.questions import Choice, Noul, Question, Score
from typevet_async._errors import InvalidInputError, QuestionError, TypevetError

__all__ = [
    "EXTENSION",
    "SystemOneCall",
    "SystemOneValidationError",
    "answer_to_system_one",
    "question_from_system_one",
    "question_to_system_one",
    "questions_from_system_one",
    "render_structured",
    "request_from_system_one",
    "request_to_system_one",
    "response_from_system_one",
    "response_to_system_one",
    "validation_detail",
]

#: The response field that carries what System One has no place for.
EXTENSION: Final = "typevet"

_IMAGE_FORMATS: Final = {"png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg"}


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
            raise QuestionError("box questions are not supported: no model here locates boxes")
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


# -- requests -----------------------------------------------------------------------------


@attrs.frozen
class SystemOneCall:
    """A System One request, as the SDK judges it."""

    model: str
    state: Any
    questions: dict[str, Question]
    #: The images the assets carried, in placeholder order: (MIME type, bytes).
    images: tuple[tuple[str, bytes], ...] = ()
    #: Each Score question's criteria as sent (its legend in the response).
    score_criteria: dict[str, list[Any]] = attrs.field(factory=dict)


class SystemOneValidationError(InvalidInputError):
    """A request that does not have the System One shape: ``detail`` is the 422 body's list."""

    def __init__(self, detail: list[dict[str, Any]]) -> None:
        first = detail[0]
        super().__init__(f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}")
        self.detail = detail


def validation_detail(
    loc: list[str | int], msg: str, kind: str, value: Any = None, ctx: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One entry of a 422 body's ``detail``."""
    entry: dict[str, Any] = {"loc": loc, "msg": msg, "type": kind, "input": value}
    if ctx is not None:
        entry["ctx"] = ctx
    return entry


def _replace_placeholders(value: Any, placeholders: dict[str, int], order: list[str]) -> Any:
    """``value`` with each placeholder replaced by ``[image N]``, N counted in order of first
    appearance (``order`` collects the placeholders as they are first met)."""
    if isinstance(value, str):
        if not placeholders:
            return value
        names = sorted(placeholders, key=len, reverse=True)  # the longest name wins
        pattern = re.compile("|".join(re.escape(name) for name in names))

        def number(match: re.Match[str]) -> str:
            name = match[0]
            if placeholders[name] == 0:
                order.append(name)
                placeholders[name] = len(order)
            return f"[image {placeholders[name]}]"

        return pattern.sub(number, value)
    if isinstance(value, dict):
        return {k: _replace_placeholders(v, placeholders, order) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_placeholders(v, placeholders, order) for v in value]
    return value


def _asset_image(name: str, asset: Any) -> tuple[str, bytes] | dict[str, Any]:
    loc: list[str | int] = ["body", "assets", name]
    if not isinstance(asset, dict):
        return validation_detail(loc, "an asset must be an object", "dict_type", asset)
    if asset.get("part") is not None:
        return validation_detail(
            [*loc, "part"], "multipart assets are not read here: send data_base64", "value_error"
        )
    mime = _IMAGE_FORMATS.get(str(asset.get("format", "")).lower())
    if asset.get("type", "image") != "image" or mime is None:
        return validation_detail(
            [*loc, "format"], "an image asset needs a format of png, jpg or jpeg", "enum",
            asset.get("format"), {"expected": "'png', 'jpg' or 'jpeg'"},
        )  # fmt: skip
    data = asset.get("data_base64")
    try:
        raw = base64.b64decode(data, validate=True) if isinstance(data, str) else None
    except (binascii.Error, ValueError):
        raw = None
    if not raw:
        return validation_detail(
            [*loc, "data_base64"], "data_base64 must be non-empty base64", "value_error"
        )
    return mime, raw


def request_from_system_one(data: Any) -> SystemOneCall:
    """A System One request body (parsed JSON) as the SDK judges it.

    :raises SystemOneValidationError: the body does not have the System One shape; ``detail``
        lists every problem found, in the 422 body's shape.
    """
    if not isinstance(data, dict):
        raise SystemOneValidationError(
            [validation_detail(["body"], "the body must be a JSON object", "dict_type", data)]
        )
    detail: list[dict[str, Any]] = []
    model = data.get("model")
    if not isinstance(model, str) or not model:
        detail.append(validation_detail(["body", "model"], "Field required", "missing", model))
    state = data.get("state")
    if not isinstance(state, str | dict | list):
        detail.append(
            validation_detail(
                ["body", "state"], "a string, an object or an array", "missing", state
            )
        )
    raw_questions = data.get("questions")
    questions: dict[str, Question] = {}
    score_criteria: dict[str, list[Any]] = {}
    if not isinstance(raw_questions, dict) or not raw_questions:
        detail.append(
            validation_detail(
                ["body", "questions"],
                "a non-empty object of name to question",
                "missing",
                raw_questions,
                {"min_length": 1},
            )
        )
        raw_questions = {}
    assets = data.get("assets") or {}
    if not isinstance(assets, dict):
        detail.append(validation_detail(["body", "assets"], "an object", "dict_type", assets))
        assets = {}
    if "" in assets:  # an empty placeholder would match everywhere
        detail.append(validation_detail(["body", "assets", ""], "an empty name", "value_error"))
        assets = {name: asset for name, asset in assets.items() if name}
    placeholders = {str(name): 0 for name in assets}
    order: list[str] = []
    state = _replace_placeholders(state, placeholders, order)
    for qid, raw in raw_questions.items():
        raw = _replace_placeholders(raw, placeholders, order)
        try:
            questions[str(qid)] = question_from_system_one(raw, str(qid))
        except QuestionError as error:
            kind = raw.get("type") if isinstance(raw, dict) else None
            loc: list[str | int] = ["body", "questions", str(qid)]
            detail.append(validation_detail(loc, str(error), "value_error", raw, {"type": kind}))
            continue
        if isinstance(raw, dict) and raw.get("type") == "score":
            score_criteria[str(qid)] = list(raw.get("criteria") or raw.get("levels") or [])
    images: list[tuple[str, bytes]] = []
    for name in order:
        image = _asset_image(name, assets[name])
        if isinstance(image, dict):
            detail.append(image)
        else:
            images.append(image)
    for name, used in placeholders.items():
        if not used:
            detail.append(
                validation_detail(
                    ["body", "assets", name],
                    "no placeholder in state, instructions or criteria uses this asset",
                    "value_error",
                )
            )
    if detail:
        raise SystemOneValidationError(detail)
    assert isinstance(model, str)
    return SystemOneCall(model, state, questions, tuple(images), score_criteria)


def request_to_system_one(
    model: str, state: Any, questions: Mapping[str, Question]
) -> dict[str, Any]:
    """A System One request body for ``questions`` about ``state``."""
    return {
        "model": model,
        "state": state,
        "questions": {qid: question_to_system_one(q) for qid, q in questions.items()},
    }


# -- responses ----------------------------------------------------------------------------


def answer_to_system_one(answer: Answer, criteria: list[Any] | None = None) -> dict[str, Any]:
    """One answer in the System One shape; a Score's legend is ``criteria`` as sent, if given."""
    if isinstance(answer, NoulAnswer):
        return {"type": "noul", "noul": answer.noul}
    if isinstance(answer, ChoiceAnswer):
        return {
            "type": "choice",
            "choice": answer.choice,
            "confidence": answer.confidence,
            "probabilities": dict(answer.probabilities),
        }
    assert isinstance(answer, ScoreAnswer)
    legend = criteria if criteria is not None and len(criteria) == len(answer.legend) else None
    return {
        "type": "score",
        "score": answer.score,
        "confidence": answer.confidence,
        "legend": {str(n): text for n, text in enumerate(legend or answer.legend)},
        "probabilities": {str(level): p for level, p in answer.probabilities.items()},
    }


def response_to_system_one(
    judgment: Judgment,
    model: str,
    *,
    score_criteria: Mapping[str, list[Any]] | None = None,
    extension: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A System One response for ``judgment``; ``extension`` (our usage and diagnostics, as the
    converter writes them) goes under `EXTENSION`."""
    criteria = score_criteria or {}
    body: dict[str, Any] = {
        "model": model,
        "answers": {
            qid: answer_to_system_one(answer, criteria.get(qid))
            for qid, answer in judgment.answers.items()
        },
        "usage": {"input_tokens": judgment.usage.prompt_tokens, "output_tokens": 0},
    }
    if extension is not None:
        body[EXTENSION] = extension
    return body


_LEVEL: Final = re.compile(r"0|[1-9][0-9]*")


def response_from_system_one(data: Any) -> tuple[str, dict[str, dict[str, Any]], int]:
    """The model, the answers (as sent) and the input tokens of a System One response.

    :raises InvalidInputError: not a System One response.
    """
    if not isinstance(data, dict):
        raise InvalidInputError("a System One response is a JSON object")
    model, answers, usage = data.get("model"), data.get("answers"), data.get("usage")
    if not isinstance(model, str) or not isinstance(answers, dict) or not isinstance(usage, dict):
        raise InvalidInputError("a System One response has model, answers and usage")
    tokens = usage.get("input_tokens")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        raise InvalidInputError("usage.input_tokens must be a non-negative integer")
    for qid, answer in answers.items():
        if not isinstance(answer, dict) or answer.get("type") not in ("noul", "choice", "score"):
            raise InvalidInputError(f"answer {qid!r} is not a noul, choice or score answer")
        if answer["type"] == "score" and not all(
            _LEVEL.fullmatch(k) for k in answer.get("probabilities", {})
        ):
            raise InvalidInputError(f"answer {qid!r}: score levels are keyed 0, 1, ...")
    return model, answers, tokens
