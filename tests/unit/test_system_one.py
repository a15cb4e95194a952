"""The System One wire (`typevet_async._core.wires.system_one`) against the official client's own
models.

``typesafe_sdk._schemas.models`` are the pydantic models the official client (``typesafe-sdk``
on PyPI) builds its requests with and parses responses into: every request they build parses
here, and every response and 422 body we build validates against them.
"""

from __future__ import annotations

import base64
import warnings
from typing import Any

import orjson
import pytest
from typesafe_sdk._schemas import models

import typevet_async as tv
from typevet_async._backends.system_one_wire import decode_judgment
from typevet_async._core.wires.system_one import (
    EXAMPLES_FIELD,
    EXTENSION,
    NOUL_DEFAULT_INSTRUCTIONS,
    SystemOneValidationError,
    examples_advertisement,
    render_structured,
    request_from_system_one,
    request_to_system_one,
    response_to_system_one,
)

from .stubs import InMemoryStubBackend

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def official_request(**fields: Any) -> dict[str, Any]:
    """A request body exactly as the official client's models serialise it."""
    request = models.SystemOneRequest(
        model=fields.pop("model", "gemma-3-270m"),
        state=fields.pop("state", {"subject": "Duplicate charge", "message": "Charged twice."}),
        questions=fields.pop(
            "questions",
            {
                "refund": models.NoulQuestion(
                    type="noul",
                    instructions="Is a refund requested?",
                    criteria=models.NoulCriteria(true="They ask for money back"),
                ),
                "route": models.ChoiceQuestion(
                    type="choice",
                    instructions={"task": "Pick the team", "teams": 3},
                    criteria={"billing": "Money matters", "shipping": None, "tech": ["bugs"]},
                ),
                "urgency": models.ScoreQuestion(
                    type="score", instructions="How urgent?", criteria=["can wait", "today"]
                ),
            },
        ),
        **fields,
    )
    return request.model_dump(mode="json", exclude_none=True)


def test_a_request_the_official_models_build_parses_into_typed_questions() -> None:
    call = request_from_system_one(official_request())
    assert call.model == "gemma-3-270m"
    assert call.state == {"subject": "Duplicate charge", "message": "Charged twice."}
    refund, route, urgency = call.questions.values()
    assert isinstance(refund, tv.Noul)
    assert refund.instructions == "Is a refund requested?"
    assert isinstance(route, tv.Choice)
    # Structured values render as compact JSON, keys in the order given.
    assert route.instructions == '{"task":"Pick the team","teams":3}'
    assert [(o.label, o.description) for o in route.options()] == [
        ("billing", "Money matters"),
        ("shipping", None),
        ("tech", '["bugs"]'),
    ]
    assert isinstance(urgency, tv.Score)
    assert urgency.levels == ("can wait", "today")
    assert call.score_criteria == {"urgency": ["can wait", "today"]}


def test_structured_text_renders_the_same_every_time() -> None:
    value = {"b": [1, "é"], "a": {"c": None}}
    assert render_structured(value, "x") == '{"b":[1,"é"],"a":{"c":null}}'
    assert render_structured(value, "x") == render_structured(dict(value), "x")
    with pytest.raises(tv.QuestionError, match="must be a string, an object or an array"):
        render_structured(3.5, "instructions")


@pytest.mark.asyncio
async def test_a_response_validates_against_the_official_response_model() -> None:
    call = request_from_system_one(official_request())
    async with tv.Session(InMemoryStubBackend()) as session:
        judgment = await session.judge(call.state, call.questions)
    extension = tv.converter.unstructure(judgment)
    body = response_to_system_one(
        judgment, "gemma-3-270m", score_criteria=call.score_criteria, extension=extension
    )
    parsed = models.SystemOneResponse.model_validate(body)
    assert parsed.model == "gemma-3-270m"
    assert list(parsed.answers) == ["refund", "route", "urgency"]
    refund = parsed.answers["refund"].root
    assert isinstance(refund, models.NoulAnswer)
    assert refund.noul == judgment["refund"].noul  # type: ignore[union-attr]
    urgency = parsed.answers["urgency"].root
    assert isinstance(urgency, models.ScoreAnswer)
    assert urgency.legend == {"0": "can wait", "1": "today"}
    assert set(urgency.probabilities) == {"0", "1"}
    assert parsed.usage.input_tokens == judgment.usage.prompt_tokens
    assert parsed.usage.output_tokens == 0  # no token is generated
    # Our richer record rides along; System One clients ignore it.
    assert body[EXTENSION]["usage"] == {  # three reads, 10 prompt tokens each
        "prompt_tokens": 30,
        "cached_tokens": 0,
        "reads": 3,
        "cache_hits": 0,
    }
    assert set(body[EXTENSION]["diagnostics"]) == {"refund", "route", "urgency"}
    # And back, as `Session.system_one` reads it: the same judgment, diagnostics included.
    assert decode_judgment(orjson.dumps(body), list(call.questions.items())) == judgment


def test_a_scores_legend_carries_structured_criteria_as_sent() -> None:
    criteria: list[Any] = [{"level": "low"}, "high"]
    questions = {"u": models.ScoreQuestion(type="score", instructions="x", criteria=criteria)}
    call = request_from_system_one(official_request(questions=questions))
    urgency = call.questions["u"]
    assert isinstance(urgency, tv.Score)
    assert urgency.levels == ('{"level":"low"}', "high")
    answer = tv.ScoreAnswer(0.5, {0: 0.5, 1: 0.5}, urgency.levels, 0.0)
    judgment = tv.Judgment({"u": answer}, tv.Usage(10, 0, 1), {})
    body = response_to_system_one(judgment, "m", score_criteria=call.score_criteria)
    parsed = models.SystemOneResponse.model_validate(body)
    assert parsed.answers["u"].root.legend == {"0": {"level": "low"}, "1": "high"}  # type: ignore[union-attr]


def test_our_requests_parse_with_the_official_models_and_back() -> None:
    questions: dict[str, tv.Question] = {
        "refund": tv.Noul(instructions="Refund?", criteria={"true": "money back"}),
        "route": tv.Choice({"billing": "Money", "shipping": None}, instructions="Team?"),
        "urgency": tv.Score(["low", "high"], instructions="Urgent?"),
    }
    body = request_to_system_one("m", "ticket", questions)
    models.SystemOneRequest.model_validate(body)
    assert request_from_system_one(body).questions == questions


def test_validation_failures_have_the_official_422_shape() -> None:
    body = official_request()
    body["questions"]["where"] = {"type": "box", "instructions": "Find the logo"}
    body["questions"]["urgency"]["criteria"] = "not a list"
    del body["state"]
    with pytest.raises(SystemOneValidationError) as caught:
        request_from_system_one(body)
    parsed = models.HTTPValidationError.model_validate({"detail": caught.value.detail})
    assert parsed.detail is not None
    locations = [entry.loc for entry in parsed.detail]
    assert locations == [
        ["body", "state"],
        ["body", "questions", "urgency"],
        ["body", "questions", "where"],
    ]
    assert "box questions are not supported" in parsed.detail[2].msg
    assert parsed.detail[2].type == "unsupported"  # System One's type, not one served here
    assert parsed.detail[1].type == "value_error"
    assert isinstance(caught.value, tv.InvalidInputError)  # an SDK error like any other


@pytest.mark.parametrize("instructions", ["absent", None])
def test_a_noul_without_instructions_is_asked_the_default_text(instructions: Any) -> None:
    question: dict[str, Any] = {
        "type": "noul", "criteria": {"true": "A chargeback threat", "false": "No threat"}
    }  # fmt: skip
    if instructions != "absent":
        question["instructions"] = instructions
    body = official_request(questions={"threat": question})
    models.SystemOneRequest.model_validate(body)  # the official models allow it too
    call = request_from_system_one(body)
    assert NOUL_DEFAULT_INSTRUCTIONS == "Which of these holds: yes or no?"
    assert call.questions["threat"] == tv.Noul(
        instructions=NOUL_DEFAULT_INSTRUCTIONS,
        criteria={"true": "A chargeback threat", "false": "No threat"},
    )
    # An empty string is not "without instructions": still refused.
    with pytest.raises(SystemOneValidationError, match="non-empty"):
        request_from_system_one(
            official_request(questions={"q": {"type": "noul", "instructions": " "}})
        )
    # A Choice or Score still needs them (our questions do; System One's docs show them).
    with pytest.raises(SystemOneValidationError):
        request_from_system_one(
            official_request(
                questions={"q": {"type": "choice", "criteria": {"a": None, "b": None}}}
            )
        )


def test_document_is_read_as_state_and_both_are_refused() -> None:
    body = official_request()
    state = body.pop("state")
    assert request_from_system_one({**body, "document": state}).state == state
    with pytest.raises(SystemOneValidationError) as caught:
        request_from_system_one({**body, "document": state, "state": state})
    [entry] = caught.value.detail
    assert entry["loc"] == ["body", "document"]
    assert "not both" in entry["msg"]
    with pytest.raises(SystemOneValidationError) as caught:
        request_from_system_one({**body, "document": 7})
    assert [entry["loc"] for entry in caught.value.detail] == [["body", "document"]]


def test_the_wire_confidence_is_the_reference_formula_and_the_entropy_in_the_extension() -> None:
    from typevet_async._apps.gateway.responses import extension
    from typevet_async._core.reading.answers import build_answer, entropy_confidence

    route = tv.Choice(["a", "b", "c"], instructions="q")
    urgency = tv.Score(["low", "mid", "high"], instructions="q")
    judgment = tv.Judgment(
        {"route": build_answer(route, [0.6, 0.3, 0.1]),
         "urgency": build_answer(urgency, [0.1, 0.2, 0.7])}
    )  # fmt: skip
    body = response_to_system_one(judgment, "m", extension=extension(judgment))
    models.SystemOneResponse.model_validate(body)
    choice, score = body["answers"]["route"], body["answers"]["urgency"]
    assert choice["confidence"] == pytest.approx((0.6 - 1 / 3) / (1 - 1 / 3))
    assert score["confidence"] == pytest.approx(1 - (0.1 * 2 + 0.2 * 1) / (2 / 3))
    recorded = body[EXTENSION]["answers"]  # the spec's answer holds the spec's fields only
    assert recorded["route"]["entropy_confidence"] == entropy_confidence([0.6, 0.3, 0.1])
    assert recorded["urgency"]["entropy_confidence"] == entropy_confidence([0.1, 0.2, 0.7])
    assert list(choice) == ["type", "choice", "confidence", "probabilities"]


def test_the_old_levels_form_is_read_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match="'levels' is the old form"):
        questions = tv.questions_from_json(
            {"urgency": {"type": "score", "instructions": "x", "levels": ["low", "high"]}}
        )
    assert questions["urgency"] == tv.Score(["low", "high"], instructions="x")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tv.questions_from_json(
            {"urgency": {"type": "score", "instructions": "x", "criteria": ["low", "high"]}}
        )


def test_an_image_asset_becomes_an_image_of_the_judgment_in_placeholder_order() -> None:
    asset = models.Asset(type="image", format="png", data_base64=base64.b64encode(PNG).decode())
    body = official_request(
        state="Receipt: 8f1c-uuid. Logo: 77aa-uuid.",
        assets={"77aa-uuid": asset, "8f1c-uuid": asset},
    )
    call = request_from_system_one(body)
    assert call.state == "Receipt: [image 1]. Logo: [image 2]."
    assert [mime for mime, _ in call.images] == ["image/png", "image/png"]
    assert call.images[0][1] == PNG


def test_an_asset_no_placeholder_uses_or_one_that_is_not_an_image_is_refused() -> None:
    unused = models.Asset(type="image", format="png", data_base64=base64.b64encode(PNG).decode())
    part = models.Asset(type="image", format="png", part="file1")
    body = official_request(
        state="uses part-uuid only", assets={"unused-uuid": unused, "part-uuid": part}
    )
    with pytest.raises(SystemOneValidationError) as caught:
        request_from_system_one(body)
    models.HTTPValidationError.model_validate({"detail": caught.value.detail})
    messages = {tuple(entry["loc"]): entry["msg"] for entry in caught.value.detail}
    assert "multipart" in messages[("body", "assets", "part-uuid", "part")]
    assert "no placeholder" in messages[("body", "assets", "unused-uuid")]


def test_an_empty_asset_name_is_refused_not_matched_everywhere() -> None:
    body = official_request(state="plain text", assets={"": {"type": "image"}})
    with pytest.raises(SystemOneValidationError) as caught:
        request_from_system_one(body)
    assert caught.value.detail[0]["loc"] == ["body", "assets", ""]


# -- one declared answer schema -------------------------------------------------------------


def test_every_answer_shape_is_built_from_the_one_declared_schema() -> None:
    """The renderer, the backend's decoders, MCP's result types and Ray's Arrow types all
    follow `typevet_async._core.wires.system_one.schema`: change a field there, and each follows."""
    from typevet_async._apps.mcp import tools
    from typevet_async._apps.ray import answer_type
    from typevet_async._backends import system_one_wire
    from typevet_async._core.reading.answers import build_answer
    from typevet_async._core.wires.system_one import (
        ANSWER_FIELDS,
        answer_to_system_one,
        wire_fields,
    )

    questions = {
        "noul": tv.Noul(instructions="q"),
        "choice": tv.Choice(["a", "b", "c"], instructions="q"),
        "score": tv.Score(["low", "high"], instructions="q"),
    }
    results = {"noul": tools.NoulResult, "choice": tools.ChoiceResult, "score": tools.ScoreResult}
    for kind, question in questions.items():
        declared = [field.name for field in ANSWER_FIELDS[kind]]
        on_wire = [field.name for field in wire_fields(kind)]
        answer = build_answer(question, [1 / len(question.options())] * len(question.options()))
        assert list(answer_to_system_one(answer)) == on_wire
        assert list(results[kind].__annotations__) == declared
        assert answer_type(question).names == on_wire
        struct = system_one_wire._ANSWER_STRUCTS[kind]
        read = [f.name for f in ANSWER_FIELDS[kind] if f.read and f.name != "type"]
        assert list(struct.__struct_fields__) == read
        assert struct.__struct_config__.tag == kind


EXAMPLE_QUESTIONS: dict[str, tv.Question] = {
    "refund": tv.Noul(
        instructions="Refund?", examples=[("Money back, please.", True), ("Where is it?", False)]
    ),
    "route": tv.Choice(
        {"billing": "Money", "shipping": None},
        instructions="Team?",
        examples=[("I was billed twice.", "billing")],
    ),
    "urgency": tv.Score(["low", "high"], instructions="Urgent?", examples=[("No rush.", 0)]),
}


def test_examples_ride_in_x_examples_with_the_answers_as_given_and_read_back() -> None:
    body = request_to_system_one("m", "ticket", EXAMPLE_QUESTIONS)
    sent = body["questions"]
    assert sent["refund"][EXAMPLES_FIELD] == [
        {"state": "Money back, please.", "answer": True},
        {"state": "Where is it?", "answer": False},
    ]
    assert sent["route"][EXAMPLES_FIELD] == [{"state": "I was billed twice.", "answer": "billing"}]
    assert sent["urgency"][EXAMPLES_FIELD] == [{"state": "No rush.", "answer": 0}]
    models.SystemOneRequest.model_validate(body)  # an x_ extension: the official models take it
    assert request_from_system_one(body).questions == EXAMPLE_QUESTIONS
    # A question without examples sends no field at all.
    plain = request_to_system_one("m", "t", {"q": tv.Noul("Refund?")})["questions"]["q"]
    assert EXAMPLES_FIELD not in plain


@pytest.mark.parametrize(
    ("examples", "problem"),
    [
        ("Money back", "must be an array"),
        ([["Money back", True]], r"examples\[0\] must be an object of exactly"),
        ([{"state": "Money back"}], r"examples\[0\] must be an object of exactly"),
        ([{"state": "a", "answer": True, "why": "x"}], "exactly"),
        ([{"state": "a", "answer": "yes"}], "True or False"),
        ([{"state": {"text": "a"}, "answer": True}], "non-empty text"),
        ([{"state": "a", "answer": True}] * 65, "at most 64"),
    ],
)
def test_bad_examples_on_the_wire_are_a_422_naming_the_question(
    examples: Any, problem: str
) -> None:
    body = {
        "model": "m",
        "state": "t",
        "questions": {
            "refund": {"type": "noul", "instructions": "Refund?", EXAMPLES_FIELD: examples}
        },
    }
    with pytest.raises(SystemOneValidationError, match=problem) as raised:
        request_from_system_one(body)
    [entry] = raised.value.detail
    assert entry["loc"] == ["body", "questions", "refund"]


def test_a_choice_or_score_example_answer_must_be_one_of_its_options() -> None:
    for question, answer in (
        ({"type": "choice", "instructions": "Team?", "criteria": {"a": None, "b": None}}, "c"),
        ({"type": "score", "instructions": "Urgent?", "criteria": ["low", "high"]}, 2),
    ):
        body = {
            "model": "m",
            "state": "t",
            "questions": {"q": {**question, EXAMPLES_FIELD: [{"state": "s", "answer": answer}]}},
        }
        with pytest.raises(SystemOneValidationError, match="examples"):
            request_from_system_one(body)


def test_the_gateway_advertises_the_examples_field_and_its_cap() -> None:
    assert examples_advertisement() == {"field": EXAMPLES_FIELD, "max_examples": 64}
