"""The Decisions wire (`typevet_async._core.wires.decisions`) against the ``openai`` package's own
types: requests as ``decision_create_params`` declares them become typed questions, and every
response we build validates as ``openai.types.Decision`` (typed choice values kept)."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest
from openai.types.decision import Decision

import typevet_async as tv
from typevet_async._apps.gateway.decisions import openai_error
from typevet_async._backends.openai_decisions import decode_decisions
from typevet_async._core.reading.answers import Judgment, build_answer
from typevet_async._core.wires.decisions import (
    DecisionsValidationError,
    request_from_decisions,
    request_to_decisions,
    response_to_decisions,
)

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 8
QUESTIONS: list[dict[str, Any]] = [
    {"type": "predicate", "name": "refund", "instructions": "Is a refund requested?"},
    {
        "type": "choice",
        "instructions": [{"type": "input_text", "text": "Angry?"}],
        "choices": [
            {"value": True},
            {"value": "unsure", "description": "can't tell"},
            {"value": False},
        ],
    },
    {
        "type": "score",
        "name": "urgency",
        "instructions": "How urgent?",
        "levels": [{"label": "low"}, {"label": "high", "description": "today"}],
    },
]


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "input": "ticket", "questions": QUESTIONS, **fields}


def problems(data: Any) -> list[tuple[list[Any], str]]:
    with pytest.raises(DecisionsValidationError) as caught:
        request_from_decisions(data)
    assert isinstance(caught.value, tv.InvalidInputError)
    return [(entry["loc"], entry["type"]) for entry in caught.value.detail]


def test_questions_become_the_sdks_own_with_names_and_typed_values() -> None:
    call = request_from_decisions(body())
    assert call.questions == {
        "0": tv.Noul("Is a refund requested?"),
        "1": tv.Choice(
            {"true": None, "unsure": "can't tell", "false": None}, instructions="Angry?"
        ),
        "2": tv.Score(["low", "high: today"], instructions="How urgent?"),
    }
    assert call.names == ("refund", None, "urgency")
    assert call.values == {"1": (True, "unsure", False)}
    assert call.levels == {"2": ("low", "high")}


def test_a_response_validates_as_the_clients_decision_with_typed_values() -> None:
    call = request_from_decisions(body())
    answers = {
        "0": build_answer(call.questions["0"], [0.3, 0.7]),
        "1": build_answer(call.questions["1"], [0.5, 0.2, 0.3]),
        "2": build_answer(call.questions["2"], [0.25, 0.75]),
    }
    raw = response_to_decisions(call, answers, "gemma", refused=frozenset({"2"}),
                                prompt_tokens=30, cached_tokens=12)  # fmt: skip
    decision = Decision.model_validate(orjson.loads(orjson.dumps(raw)))
    predicate, choice, score = decision.answers
    assert (predicate.type, predicate.name, predicate.probability) == ("predicate", "refund", 0.7)
    assert choice.type == "choice"
    assert choice.choice is True
    assert [p.value for p in choice.probabilities] == [True, "unsure", False]
    assert (score.type, score.name) == ("refusal", "urgency")
    assert decision.usage.input_tokens_details.cached_tokens == 12
    assert decision.usage.total_tokens == 30


def test_every_problem_is_listed_with_its_place() -> None:
    wide = {**QUESTIONS[1], "choices": [{"value": f"v{n}"} for n in range(256)]}
    clash = {**QUESTIONS[1], "choices": [{"value": "true"}, {"value": True}]}
    twice = {**QUESTIONS[1], "choices": [{"value": "a"}, {"value": "a"}]}
    seen = problems(body(questions=[wide, clash, twice, {"type": "box"}], extra=1))
    assert seen == [
        (["body", "extra"], "unknown_parameter"),
        (["body", "questions", 0, "choices"], "too_long"),
        (["body", "questions", 1, "choices", 1, "value"], "value_error"),
        (["body", "questions", 2, "choices", 1, "value"], "value_error"),
        (["body", "questions", 3, "instructions"], "value_error"),
        (["body", "questions", 3, "type"], "value_error"),
    ]
    assert problems(body(questions=QUESTIONS[:1] * 401)) == [(["body", "questions"], "too_long")]
    assert problems(body(questions=[])) == [(["body", "questions"], "missing")]
    assert problems([]) == [(["body"], "dict_type")]


def test_images_are_read_from_data_urls_only() -> None:
    data_url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    parts = [{"type": "input_text", "text": "Look"}, {"type": "input_image", "image_url": data_url}]
    call = request_from_decisions(body(input=[{"role": "user", "content": parts}]))
    assert call.state == "Look\n[image 1]"
    assert call.images == (("image/png", PNG),)
    remote = [{"type": "input_image", "image_url": "https://example.com/a.png"}]
    seen = problems(body(input=[{"role": "user", "content": remote}]))
    assert seen == [(["body", "input", 0, "content", 0, "image_url"], "unsupported")]


def test_messages_and_tool_items_become_the_state() -> None:
    ticket = {"subject": "charge"}
    json_input = [{"role": "user", "content": [{"type": "input_json", "data": ticket}]}]
    assert request_from_decisions(body(input=json_input)).state == ticket
    items = [
        {"role": "system", "content": "Be brief."},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "found"},
    ]
    assert request_from_decisions(body(input=items)).state == [
        {"role": "system", "content": "Be brief."},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "found"},
    ]
    orphan = [{"type": "function_call_output", "call_id": "c9", "output": "x"}]
    assert problems(body(input=orphan)) == [(["body", "input", 0, "call_id"], "value_error")]


def test_the_clients_request_reads_back_as_the_same_questions() -> None:
    typed = [
        ("refund", tv.Noul("Refund?")),
        ("route", tv.Choice({"billing": "money", "shipping": None}, instructions="Team?")),
        ("urgency", tv.Score(["low", "high"], instructions="Urgent?")),
    ]
    sent = request_to_decisions("m", {"a": 1}, typed)
    call = request_from_decisions(sent)
    assert list(call.questions.values()) == [q for _, q in typed]
    assert call.state == {"a": 1}
    assert call.names == ("refund", "route", "urgency")
    with pytest.raises(tv.QuestionError, match="criteria"):
        request_to_decisions("m", "x", [("q", tv.Noul("Yes?", criteria={"true": "it is"}))])
    # Decisions has no field for examples: refused, never sent without them.
    with pytest.raises(tv.QuestionError, match="carries no examples") as raised:
        request_to_decisions("m", "x", [("q", tv.Noul("Yes?", examples=[("money back", True)]))])
    assert raised.value.question_id == "q"


def _reply(answers: list[dict[str, Any]]) -> bytes:
    return orjson.dumps({"model": "m", "answers": answers, "usage": {"input_tokens": 9}})


def test_a_servers_answers_are_checked_and_typed() -> None:
    typed = [("yes", tv.Noul("Yes?")), ("level", tv.Score(["low", "high"], instructions="?"))]
    one_based = {"type": "score", "name": "level", "score": 1.75, "confidence": 0.5,
                 "probabilities": [{"label": "low", "value": 1, "probability": 0.25},
                                   {"label": "high", "value": 2, "probability": 0.75}]}  # fmt: skip
    judgment = decode_decisions(
        _reply([{"type": "predicate", "name": "yes", "probability": 0.8}, one_based]), typed
    )
    assert judgment["yes"].probabilities == {"false": pytest.approx(0.2), "true": 0.8}
    assert judgment["level"].probabilities == {0: 0.25, 1: 0.75}
    with pytest.raises(tv.RefusalError) as refused:
        decode_decisions(_reply([{"type": "refusal", "name": "yes"}, one_based]), typed)
    assert refused.value.refused == ("yes",)
    assert isinstance(refused.value.answers, Judgment)
    assert list(refused.value.answers) == ["level"]
    with pytest.raises(tv.ProtocolError, match="1 answers to 2 questions"):
        decode_decisions(_reply([one_based]), typed)
    with pytest.raises(tv.ProtocolError, match="a score answer"):
        decode_decisions(_reply([one_based, one_based]), typed)


def test_gateway_errors_take_openais_shape() -> None:
    detail = [{"loc": ["body", "questions", 3, "choices"], "msg": "too many", "type": "too_long"}]
    assert openai_error(422, detail) == {
        "message": "questions[3].choices: too many", "type": "invalid_request_error",
        "param": "questions[3].choices", "code": "too_long",
    }  # fmt: skip
    denied = openai_error(401, {"error_type": "authentication_error", "message": "a key"})
    assert denied == {"message": "a key", "type": "authentication_error", "param": None,
                      "code": "authentication_error"}  # fmt: skip
    assert openai_error(503, None)["type"] == "server_error"
