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
refused. A ``multipart/form-data`` request (how the official client sends images: a
``request`` part holding the JSON, whose assets name their ``part``, then one part per image)
is HTTP work, the gateway's (`typevet_async._gateway.multipart`): it turns the parts into JSON
assets and hands the request to `request_from_system_one`.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from typevet_async._core.answers import (
    Answer,
    ChoiceAnswer,
    Judgment,
    NoulAnswer,
    ScoreAnswer,
    build_answer,
)
from typevet_async._core.jsonvalues import compact_json
from typevet_async._core.questions import Choice, Noul, Question, Score
from typevet_async._errors import (
    ProtocolError,
    QuestionError,
    SystemOneValidationError,
    TypevetError,
)

__all__ = [
    "EXTENSION",
    "SYSTEM_ONE_SLACK",
    "SystemOneAnswer",
    "SystemOneCall",
    "SystemOneValidationError",
    "answer_to_system_one",
    "answers_from_system_one",
    "question_from_system_one",
    "question_to_system_one",
    "questions_from_system_one",
    "render_structured",
    "request_from_system_one",
    "request_to_system_one",
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


def validation_detail(
    loc: list[str | int], msg: str, kind: str, value: Any = None, ctx: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One entry of a 422 body's ``detail``."""
    entry: dict[str, Any] = {"loc": loc, "msg": msg, "type": kind, "input": value}
    if ctx is not None:
        entry["ctx"] = ctx
    return entry


class _Placeholders:
    """The assets' placeholders, found in every string of a request by one pattern compiled
    once per request (the longest name wins where two overlap); each is numbered ``[image N]``
    in order of first appearance."""

    def __init__(self, names: Sequence[str]) -> None:
        self.numbers = {name: 0 for name in names}
        self.order: list[str] = []
        longest_first = sorted(self.numbers, key=len, reverse=True)
        self.pattern = (
            re.compile("|".join(re.escape(name) for name in longest_first)) if names else None
        )

    def _number(self, match: re.Match[str]) -> str:
        name = match[0]
        if self.numbers[name] == 0:
            self.order.append(name)
            self.numbers[name] = len(self.order)
        return f"[image {self.numbers[name]}]"

    def replace(self, value: Any) -> Any:
        """``value`` with each placeholder in its strings replaced (iteratively: the caller
        bounded its depth and items)."""
        if self.pattern is None:
            return value
        if isinstance(value, str):
            return self.pattern.sub(self._number, value)
        if not isinstance(value, dict | list):
            return value
        root: list[Any] = [None]
        stack: list[tuple[Any, Any, Any]] = [(value, root, 0)]
        while stack:
            item, parent, key = stack.pop()
            if isinstance(item, str):
                parent[key] = self.pattern.sub(self._number, item)
            elif isinstance(item, dict):
                copy: dict[str, Any] = dict.fromkeys(item)
                parent[key] = copy
                # reversed: the stack pops the first child first (numbers in reading order)
                stack.extend((child, copy, k) for k, child in reversed(item.items()))
            elif isinstance(item, list):
                items: list[Any] = [None] * len(item)
                parent[key] = items
                stack.extend((item[i], items, i) for i in reversed(range(len(item))))
            else:
                parent[key] = item
        return root[0]


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


def request_from_system_one(
    data: Any, *, max_assets: int | None = None, max_questions: int | None = None
) -> SystemOneCall:
    """A System One request body (parsed JSON) as the SDK judges it; at most ``max_assets``
    assets and ``max_questions`` questions (None: no limit), counted before any is read.

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
    raw_questions = _raw_questions(data.get("questions"), max_questions, detail)
    assets = _raw_assets(data.get("assets") or {}, max_assets, detail)
    placeholders = _Placeholders([str(name) for name in assets])
    state = placeholders.replace(state)
    questions, score_criteria = _questions(raw_questions, placeholders, detail)
    images: list[tuple[str, bytes]] = []
    for name in placeholders.order:
        image = _asset_image(name, assets[name])
        if isinstance(image, dict):
            detail.append(image)
        else:
            images.append(image)
    for name, used in placeholders.numbers.items():
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


def _raw_questions(
    raw: Any, max_questions: int | None, detail: list[dict[str, Any]]
) -> dict[Any, Any]:
    """The request's ``questions`` object, counted before any is read (its problems go to
    ``detail``; then none is read)."""
    if not isinstance(raw, dict) or not raw:
        detail.append(
            validation_detail(
                ["body", "questions"], "a non-empty object of name to question", "missing",
                raw, {"min_length": 1},
            )
        )  # fmt: skip
        return {}
    if max_questions is not None and len(raw) > max_questions:
        detail.append(
            validation_detail(
                ["body", "questions"], f"at most {max_questions} questions a request",
                "too_long", len(raw), {"max_length": max_questions},
            )
        )  # fmt: skip
        return {}
    return raw


def _raw_assets(raw: Any, max_assets: int | None, detail: list[dict[str, Any]]) -> dict[Any, Any]:
    """The request's ``assets`` object, counted before a placeholder is looked for."""
    if not isinstance(raw, dict):
        detail.append(validation_detail(["body", "assets"], "an object", "dict_type", raw))
        return {}
    assets: dict[Any, Any] = raw
    if "" in assets:  # an empty placeholder would match everywhere
        detail.append(validation_detail(["body", "assets", ""], "an empty name", "value_error"))
        assets = {name: asset for name, asset in assets.items() if name}
    if max_assets is not None and len(assets) > max_assets:
        detail.append(
            validation_detail(
                ["body", "assets"], f"at most {max_assets} assets a request", "too_long",
                len(assets), {"max_length": max_assets},
            )
        )  # fmt: skip
        return {}
    return assets


def _questions(
    raw_questions: dict[Any, Any], placeholders: _Placeholders, detail: list[dict[str, Any]]
) -> tuple[dict[str, Question], dict[str, list[Any]]]:
    """Each question read (its placeholders numbered), and each Score's criteria as sent."""
    questions: dict[str, Question] = {}
    score_criteria: dict[str, list[Any]] = {}
    for qid, raw in raw_questions.items():
        raw = placeholders.replace(raw)
        try:
            questions[str(qid)] = question_from_system_one(raw, str(qid))
        except QuestionError as error:
            kind = raw.get("type") if isinstance(raw, dict) else None
            loc: list[str | int] = ["body", "questions", str(qid)]
            detail.append(validation_detail(loc, str(error), "value_error", raw, {"type": kind}))
            continue
        if isinstance(raw, dict) and raw.get("type") == "score":
            score_criteria[str(qid)] = list(raw.get("criteria") or raw.get("levels") or [])
    return questions, score_criteria


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


# -- a System One server's answers, as typed answers ---------------------------------------

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
