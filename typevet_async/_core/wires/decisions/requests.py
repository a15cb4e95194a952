"""A Decisions request (``POST /v1/decisions``) parsed and checked: every problem at once, in
the 422 ``detail`` shape, before anything is judged.

The body as the ``openai`` package's ``decision_create_params`` declares it. Its ``input`` (a
string, or messages and tool items) becomes the judgment's state (`decisions_state`); its
questions become typed questions keyed by position (``"0"``, ``"1"``, ...: a Decisions
question's ``name`` is optional and need not be unique), their names and each Choice's typed
values kept beside them for the response.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any, Final

import attrs

from typevet_async._core.prompts.questions import Choice, Noul, Question, Score
from typevet_async._core.wires.jsonvalues import compact_json
from typevet_async._core.wires.system_one.requests import validation_detail
from typevet_async._errors import DecisionsValidationError, InvalidInputError

__all__ = [
    "MAX_CHOICES",
    "MAX_QUESTIONS",
    "DecisionsCall",
    "choice_label",
    "request_from_decisions",
]

#: The API's own limits (``decision_create_params``): 1-400 questions, 2-255 choices.
MAX_QUESTIONS: Final = 400
MAX_CHOICES: Final = 255
#: Score levels a question may have (the API states no limit; Choice's is kept).
_MAX_LEVELS: Final = 255

#: The body's fields; any other is refused (a misspelt option would otherwise do nothing).
_FIELDS: Final = frozenset(
    {"model", "input", "questions", "prompt_cache_key", "prompt_cache_options", "safety_identifier"}
)
_IMAGE_TYPES: Final = {
    "image/png": "image/png",
    "image/jpeg": "image/jpeg",
    "image/jpg": "image/jpeg",
    "image/webp": "image/webp",
}

Loc = list[str | int]
Detail = list[dict[str, Any]]


@attrs.frozen
class DecisionsCall:
    """A Decisions request as the SDK judges it."""

    model: str
    state: Any
    #: Questions by position (``"0"``, ``"1"``, ...), in request order.
    questions: dict[str, Question]
    #: Each question's ``name`` (None: unnamed), in request order.
    names: tuple[str | None, ...]
    #: Each Choice's values as sent (a string or a boolean), in option order.
    values: dict[str, tuple[str | bool, ...]] = attrs.field(factory=dict)
    #: Each Score's level labels, in level order.
    levels: dict[str, tuple[str, ...]] = attrs.field(factory=dict)
    #: The input's images, in order: (MIME type, bytes). Every question's reads show them.
    images: tuple[tuple[str, bytes], ...] = ()
    #: Each question's own images (from its instructions), in order, by question id: only
    #: that question's reads show them, after the input's.
    question_images: dict[str, tuple[tuple[str, bytes], ...]] = attrs.field(factory=dict)


def choice_label(value: str | bool) -> str:
    """The text a Choice value is shown to the model as: a string as it is, a boolean as
    ``true`` / ``false`` (JSON's words)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


class _Parts:
    """What the parts of a request render to: text, JSON as compact JSON, each image as
    ``[image N]`` (its bytes kept). Images are numbered as a read shows them: the input's
    1, 2, ...; a question's own after the input's (each question from the same number, as no
    read shows two questions' images)."""

    def __init__(self, detail: Detail) -> None:
        self.detail = detail
        #: The images of what is being read now (the input, then each question in turn).
        self.images: list[tuple[str, bytes]] = []
        #: Images every read shows before these (the input's, while a question is read).
        self.shown_before = 0

    def image(self, part: dict[str, Any], loc: Loc) -> str:
        url = part.get("image_url")
        if not isinstance(url, str):
            self.detail.append(validation_detail([*loc, "image_url"], "a string", "string_type"))
            return ""
        head, comma, data = url.partition(",")
        mime = head.removeprefix("data:").removesuffix(";base64").lower()
        if not (url.startswith("data:") and head.endswith(";base64") and comma):
            self.detail.append(
                validation_detail(
                    [*loc, "image_url"],
                    "only base64 data URLs are read: the gateway fetches no URL",
                    "unsupported",
                )
            )
            return ""
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if mime not in _IMAGE_TYPES or not raw:
            self.detail.append(
                validation_detail(
                    [*loc, "image_url"],
                    "a non-empty base64 PNG, JPEG or WebP data URL",
                    "value_error",
                )
            )
            return ""
        self.images.append((_IMAGE_TYPES[mime], raw))
        return f"[image {self.shown_before + len(self.images)}]"

    def text(self, content: Any, loc: Loc, kinds: frozenset[str]) -> str | None:
        """A string, or a list of parts of ``kinds``, as one text (parts joined by lines)."""
        if isinstance(content, str):
            return content
        if not isinstance(content, list) or not content:
            self.detail.append(
                validation_detail(loc, "a string or a non-empty list of parts", "value_error")
            )
            return None
        texts = [self.part(part, [*loc, n], kinds) for n, part in enumerate(content)]
        return "\n".join(text for text in texts if text is not None)

    def part(self, part: Any, loc: Loc, kinds: frozenset[str]) -> str | None:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds:
            expected = ", ".join(sorted(kinds))
            self.detail.append(
                validation_detail([*loc, "type"], f"a part of type {expected}", "value_error", kind)
            )
            return None
        assert isinstance(part, dict)
        if kind == "input_image":
            return self.image(part, loc)
        if kind == "input_json":
            data = part.get("data")
            if not isinstance(data, dict | list):
                self.detail.append(
                    validation_detail([*loc, "data"], "an object or an array", "value_error")
                )
                return None
            return compact_json(data, "input_json data")
        field = {"input_text": "text", "output_text": "text", "refusal": "refusal"}[kind]
        value = part.get(field)
        if not isinstance(value, str):
            self.detail.append(validation_detail([*loc, field], "a string", "string_type"))
            return None
        return value


_USER_PARTS: Final = frozenset({"input_text", "input_image", "input_json"})
_TEXT_PARTS: Final = frozenset({"input_text"})
_ASSISTANT_PARTS: Final = frozenset({"output_text", "refusal"})
_OUTPUT_PARTS: Final = frozenset({"input_text", "input_image"})
_ROLE_PARTS: Final = {
    "user": _USER_PARTS,
    "developer": _TEXT_PARTS,
    "system": _TEXT_PARTS,
    "assistant": _ASSISTANT_PARTS,
}
#: Tool items: each output's type, and the call type it must answer.
_CALLS: Final = {"function_call": "arguments", "custom_tool_call": "input"}
_OUTPUTS: Final = {
    "function_call_output": "function_call",
    "custom_tool_call_output": "custom_tool_call",
}


def _item(item: Any, loc: Loc, parts: _Parts, calls: set[tuple[str, str]]) -> Any:
    """One input item as the state's entry: a message ``{"role", "content"}`` (its content
    as text), a tool call or output as its fields."""
    if not isinstance(item, dict):
        parts.detail.append(validation_detail(loc, "an object", "dict_type", item))
        return None
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in _ROLE_PARTS:
            parts.detail.append(
                validation_detail(
                    [*loc, "role"], "user, developer, system or assistant", "value_error", role
                )
            )
            return None
        return {
            "role": role,
            "content": parts.text(item.get("content"), [*loc, "content"], _ROLE_PARTS[role]),
        }
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        parts.detail.append(validation_detail([*loc, "call_id"], "a non-empty string", "missing"))
        return None
    if kind in _CALLS:
        fields = {name: item.get(name) for name in ("name", _CALLS[kind])}
        if not all(isinstance(value, str) for value in fields.values()):
            parts.detail.append(
                validation_detail(
                    loc, f"{kind}: name and {_CALLS[kind]} are strings", "value_error"
                )
            )
            return None
        calls.add((kind, call_id))
        return {"type": kind, "call_id": call_id, **fields}
    if kind in _OUTPUTS:
        if (_OUTPUTS[kind], call_id) not in calls:
            parts.detail.append(
                validation_detail(
                    [*loc, "call_id"],
                    f"no earlier {_OUTPUTS[kind]} has this call_id",
                    "value_error",
                    call_id,
                )
            )
            return None
        output = parts.text(item.get("output"), [*loc, "output"], _OUTPUT_PARTS)
        return {"type": kind, "call_id": call_id, "output": output}
    parts.detail.append(
        validation_detail([*loc, "type"], "an input item type", "value_error", kind)
    )
    return None


def decisions_state(raw: Any, parts: _Parts) -> Any:
    """The judgment's state: a string ``input`` as it is; one user message as its content
    (one ``input_json`` part as its JSON value, any other content as text); several items as
    a list of their entries (`_item`), which the session renders as compact JSON."""
    loc: Loc = ["body", "input"]
    if isinstance(raw, str):
        return raw
    if not isinstance(raw, list) or not raw:
        parts.detail.append(validation_detail(loc, "a string or a non-empty list", "missing"))
        return None
    calls: set[tuple[str, str]] = set()
    entries = [_item(item, [*loc, n], parts, calls) for n, item in enumerate(raw)]
    if len(entries) == 1 and isinstance(entries[0], dict) and entries[0].get("role") == "user":
        content = raw[0].get("content")
        single = content[0] if isinstance(content, list) and len(content) == 1 else None
        if isinstance(single, dict) and single.get("type") == "input_json":
            return single.get("data")
        return entries[0]["content"]
    return entries


_INSTRUCTION_PARTS: Final = frozenset({"input_text", "input_image", "input_json"})


def _choice(raw: dict[str, Any], loc: Loc, instructions: str, detail: Detail) -> Choice | None:
    choices = raw.get("choices")
    if not isinstance(choices, list) or not 2 <= len(choices) <= MAX_CHOICES:
        count = len(choices) if isinstance(choices, list) else choices
        detail.append(
            validation_detail(
                [*loc, "choices"],
                f"between 2 and {MAX_CHOICES} choices",
                "too_long" if isinstance(count, int) else "missing",
                count,
                {"min_length": 2, "max_length": MAX_CHOICES},
            )
        )
        return None
    criteria: dict[str, str | None] = {}
    typed: dict[str, str | bool] = {}
    for n, choice in enumerate(choices):
        value = choice.get("value") if isinstance(choice, dict) else None
        description = choice.get("description") if isinstance(choice, dict) else None
        if not isinstance(value, str | bool) or not isinstance(description, str | None):
            detail.append(
                validation_detail(
                    [*loc, "choices", n],
                    "a value (a string or a boolean) and a string description",
                    "value_error",
                )
            )
            return None
        label = choice_label(value)
        if label in typed:
            same = typed[label] == value and type(typed[label]) is type(value)
            detail.append(
                validation_detail(
                    [*loc, "choices", n, "value"],
                    "each choice must be unique"
                    if same
                    else f"{typed[label]!r} and {value!r} "
                    "read the same to the model (a boolean is shown as true / false)",
                    "value_error",
                    value,
                )
            )
            return None
        typed[label] = value
        criteria[label] = description
    return Choice(criteria, instructions=instructions)


def _score(raw: dict[str, Any], loc: Loc, instructions: str, detail: Detail) -> Score | None:
    levels = raw.get("levels")
    if not isinstance(levels, list) or not 2 <= len(levels) <= _MAX_LEVELS:
        detail.append(
            validation_detail(
                [*loc, "levels"], f"between 2 and {_MAX_LEVELS} levels", "value_error"
            )
        )
        return None
    texts: list[str] = []
    for n, level in enumerate(levels):
        label = level.get("label") if isinstance(level, dict) else None
        description = level.get("description") if isinstance(level, dict) else None
        if not isinstance(label, str) or not isinstance(description, str | None):
            detail.append(
                validation_detail(
                    [*loc, "levels", n],
                    "a label and an optional description, both strings",
                    "value_error",
                )
            )
            return None
        texts.append(f"{label}: {description}" if description else label)
    return Score(texts, instructions=instructions)


def _question(raw: Any, loc: Loc, parts: _Parts) -> Question | None:
    """One question, or None (its problems in ``parts.detail``)."""
    detail = parts.detail
    if not isinstance(raw, dict):
        detail.append(validation_detail(loc, "a question object", "dict_type", raw))
        return None
    kind = raw.get("type")
    instructions = parts.text(raw.get("instructions"), [*loc, "instructions"], _INSTRUCTION_PARTS)
    if kind not in ("predicate", "choice", "score"):
        detail.append(
            validation_detail([*loc, "type"], "predicate, choice or score", "value_error", kind)
        )
        return None
    name = raw.get("name")
    if name is not None and not isinstance(name, str):
        detail.append(validation_detail([*loc, "name"], "a string", "string_type", name))
        return None
    if instructions is None:
        return None
    build: Callable[[dict[str, Any], Loc, str, Detail], Question | None] = (
        _choice if kind == "choice" else _score if kind == "score" else _predicate
    )
    try:
        return build(raw, loc, instructions, detail)
    except InvalidInputError as error:  # the SDK's own question rules (QuestionError, text)
        detail.append(validation_detail(loc, str(error), "value_error"))
        return None


def _predicate(raw: dict[str, Any], loc: Loc, instructions: str, detail: Detail) -> Noul:
    return Noul(instructions=instructions)


def _top_level(data: dict[Any, Any], detail: Detail) -> None:
    """Unknown fields and the optional fields' types (read, not used: the gateway's server
    has its own prompt cache, and no end-user identifier to scope)."""
    for name in data:
        if name not in _FIELDS:
            detail.append(
                validation_detail(["body", str(name)], "an unknown parameter", "unknown_parameter")
            )
    for name in ("prompt_cache_key", "safety_identifier"):
        if not isinstance(data.get(name), str | None):
            detail.append(validation_detail(["body", name], "a string", "string_type"))
    if not isinstance(data.get("prompt_cache_options"), dict | None):
        detail.append(validation_detail(["body", "prompt_cache_options"], "an object", "dict_type"))


def request_from_decisions(data: Any, *, max_questions: int = MAX_QUESTIONS) -> DecisionsCall:
    """A Decisions request body (parsed JSON) as the SDK judges it; at most ``max_questions``
    questions (never more than the API's 400), counted before any is read.

    :raises DecisionsValidationError: not the Decisions shape; ``detail`` lists every
        problem found.
    """
    if not isinstance(data, dict):
        raise DecisionsValidationError(
            [validation_detail(["body"], "the body must be a JSON object", "dict_type")]
        )
    detail: Detail = []
    _top_level(data, detail)
    model = data.get("model")
    if not isinstance(model, str) or not model:
        detail.append(validation_detail(["body", "model"], "Field required", "missing", model))
    parts = _Parts(detail)
    state = decisions_state(data.get("input"), parts)
    raw_questions = data.get("questions")
    limit = min(max_questions, MAX_QUESTIONS)
    if not isinstance(raw_questions, list) or not 1 <= len(raw_questions) <= limit:
        count = len(raw_questions) if isinstance(raw_questions, list) else None
        detail.append(
            validation_detail(
                ["body", "questions"],
                f"between 1 and {limit} questions",
                "too_long" if count else "missing",
                count,
                {"min_length": 1, "max_length": limit},
            )
        )
        raise DecisionsValidationError(detail)
    input_images = tuple(parts.images)
    questions: dict[str, Question] = {}
    own: dict[str, tuple[tuple[str, bytes], ...]] = {}
    for n, raw in enumerate(raw_questions):
        parts.images, parts.shown_before = [], len(input_images)
        question = _question(raw, ["body", "questions", n], parts)
        if question is not None:
            questions[str(n)] = question
            if parts.images:
                own[str(n)] = tuple(parts.images)
    if detail:
        raise DecisionsValidationError(detail)
    assert isinstance(model, str)
    return DecisionsCall(
        model,
        state,
        questions,
        names=tuple(raw.get("name") for raw in raw_questions),
        values={
            qid: tuple(_typed_values(raw_questions[int(qid)]))
            for qid, q in questions.items()
            if isinstance(q, Choice)
        },
        levels={
            qid: tuple(level["label"] for level in raw_questions[int(qid)]["levels"])
            for qid, q in questions.items()
            if isinstance(q, Score)
        },
        images=input_images,
        question_images=own,
    )


def _typed_values(raw: dict[str, Any]) -> list[str | bool]:
    values: list[str | bool] = [choice["value"] for choice in raw["choices"]]
    return values
