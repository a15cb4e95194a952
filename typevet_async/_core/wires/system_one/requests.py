"""A System One request, parsed and checked (every problem at once, in the 422 shape), with
its image assets placed by their placeholders; and a request built from typed questions."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from typevet_async._core.prompts.questions import Question
from typevet_async._core.wires.system_one.questions import (
    UnsupportedQuestionError,
    question_from_system_one,
    question_to_system_one,
)
from typevet_async._errors import QuestionError, SystemOneValidationError

__all__ = [
    "SystemOneCall",
    "request_from_system_one",
    "request_to_system_one",
    "state_problem",
    "validation_detail",
]

_IMAGE_FORMATS: Final = {"png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg"}


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
            [*loc, "format"],
            "an image asset needs a format of png, jpg or jpeg",
            "enum",
            asset.get("format"),
            {"expected": "'png', 'jpg' or 'jpeg'"},
        )
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
    data: Any,
    *,
    max_assets: int | None = None,
    max_questions: int | None = None,
    served_models: Sequence[str] = (),
) -> SystemOneCall:
    """A System One request body (parsed JSON) as the SDK judges it; at most ``max_assets``
    assets and ``max_questions`` questions (None: no limit), counted before any is read.
    ``document`` (the v1 draft's name) is read as ``state``; a body with both is refused.
    A body without ``model`` (or with null) is answered by the one model of
    ``served_models`` when there is exactly one (`_model`).

    :raises SystemOneValidationError: the body does not have the System One shape; ``detail``
        lists every problem found, in the 422 body's shape.
    """
    if not isinstance(data, dict):
        raise SystemOneValidationError(
            [validation_detail(["body"], "the body must be a JSON object", "dict_type", data)]
        )
    detail: list[dict[str, Any]] = []
    model = _model(data, served_models, detail)
    state = _state(data, detail)
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


def _model(
    data: dict[Any, Any], served_models: Sequence[str], detail: list[dict[str, Any]]
) -> str | None:
    """The model a request names; when it names none (no ``model``, or null), the one model
    the server serves. jevcompat's spec does not count a missing ``model`` among the invalid
    requests a server should refuse (only the official schema lists it as required), and
    public harnesses omit it, so a server that can only mean one model answers with it. With
    none or several served, a missing model is a 422 at ``["body", "model"]`` naming them.
    A ``model`` that is not a non-empty string is a 422 as well (its problems go to
    ``detail``; then the result is None)."""
    model = data.get("model")
    if model is None and len(served_models) == 1:
        return served_models[0]
    if isinstance(model, str) and model:
        return model
    msg = "Field required"
    if model is None and served_models:
        names = ", ".join(repr(name) for name in served_models)
        msg += f": this server serves {len(served_models)} models ({names}), name one"
    detail.append(validation_detail(["body", "model"], msg, "missing", model))
    return None


def _state(data: dict[Any, Any], detail: list[dict[str, Any]]) -> Any:
    """The request's ``state``, or ``document`` (the v1 draft's name for it); not both."""
    if "state" in data and "document" in data:
        detail.append(
            validation_detail(
                ["body", "document"],
                "give state or document (its alias), not both",
                "value_error",
                None,
            )
        )
        return None
    name = "document" if "document" in data else "state"
    state = data.get(name)
    problem = state_problem(state, ["body", name])
    if problem is not None:
        detail.append(problem)
    return state


def state_problem(state: Any, loc: list[str | int]) -> dict[str, Any] | None:
    """What is wrong with a request's state at ``loc`` (a 422 entry), or None: a state is a
    string, an object or an array (a batch's states are each held to it)."""
    if isinstance(state, str | dict | list):
        return None
    return validation_detail(loc, "a string, an object or an array", "missing", state)


def _raw_questions(
    raw: Any, max_questions: int | None, detail: list[dict[str, Any]]
) -> dict[Any, Any]:
    """The request's ``questions`` object, counted before any is read (its problems go to
    ``detail``; then none is read)."""
    if not isinstance(raw, dict) or not raw:
        detail.append(
            validation_detail(
                ["body", "questions"],
                "a non-empty object of name to question",
                "missing",
                raw,
                {"min_length": 1},
            )
        )
        return {}
    if max_questions is not None and len(raw) > max_questions:
        detail.append(
            validation_detail(
                ["body", "questions"],
                f"at most {max_questions} questions a request",
                "too_long",
                len(raw),
                {"max_length": max_questions},
            )
        )
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
                ["body", "assets"],
                f"at most {max_assets} assets a request",
                "too_long",
                len(assets),
                {"max_length": max_assets},
            )
        )
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
            unsupported = isinstance(error, UnsupportedQuestionError)
            problem = "unsupported" if unsupported else "value_error"
            detail.append(validation_detail(loc, str(error), problem, raw, {"type": kind}))
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
