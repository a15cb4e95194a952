"""What a strict client of the System One spec needs from the wire.

- ``model`` may be left out where the server serves one model (jevcompat's spec does not list a
  missing ``model`` among the requests a server should refuse; public harnesses such as
  krite-bench omit it). With several served it is a 422 naming them; a ``model`` the request
  names is read as before.
- Every answer holds exactly the spec's fields: it validates against the official client's
  models and against a strict JSON schema of the spec's answer (``additionalProperties:
  false``, as krite-bench's answer schema has it); the SDK's own extras (the entropy
  confidence, usage, diagnostics) ride in the top-level ``x_typevet`` extension, where the
  spec allows ``x_`` fields and strict clients drop them, and the SDK's client reads them back
  from there.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import orjson
import pytest
from jevcompat.validate import ANSWER_FIELDS as SPEC_ANSWER_FIELDS
from jevcompat.validate import TOP_LEVEL as SPEC_TOP_LEVEL
from typesafe_sdk._schemas import models

import typevet_async as tv
from typevet_async._backends.system_one_wire import decode_judgment
from typevet_async._core.reading.answers import build_answer, entropy_confidence
from typevet_async._core.wires.decisions import request_from_decisions
from typevet_async._core.wires.system_one import (
    EXTENSION,
    SystemOneValidationError,
    batch_from_system_one,
    request_from_system_one,
    response_to_system_one,
)
from typevet_async._errors import DecisionsValidationError

from .test_gateway import AUTH, request_body, start

QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Is a refund requested?"},
    "route": {
        "type": "choice",
        "instructions": "Team?",
        "criteria": {"billing": None, "tech": None},
    },
    "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["low", "mid", "high"]},
}


def body_without_model() -> dict[str, Any]:
    return {"state": "I was charged twice.", "questions": QUESTIONS}


# -- model --------------------------------------------------------------------------------


@pytest.mark.parametrize("absent", ["missing", "null"])
def test_a_request_without_model_is_answered_by_the_one_model_served(absent: str) -> None:
    body = body_without_model() if absent == "missing" else {**body_without_model(), "model": None}
    call = request_from_system_one(body, served_models=["gemma-3-270m"])
    assert call.model == "gemma-3-270m"
    assert list(call.questions) == ["refund", "route", "urgency"]


def test_a_request_without_model_is_refused_where_two_models_are_served() -> None:
    with pytest.raises(SystemOneValidationError) as caught:
        request_from_system_one(body_without_model(), served_models=["small", "large"])
    [entry] = caught.value.detail
    assert entry["loc"] == ["body", "model"]
    assert entry["type"] == "missing"
    assert "2 models ('small', 'large'), name one" in entry["msg"]
    models.HTTPValidationError.model_validate({"detail": caught.value.detail})


def test_a_request_without_model_is_refused_where_no_model_is_known() -> None:
    with pytest.raises(SystemOneValidationError) as caught:
        request_from_system_one(body_without_model())
    assert [(e["loc"], e["msg"]) for e in caught.value.detail] == [
        (["body", "model"], "Field required")
    ]


@pytest.mark.parametrize("model", ["no-such-model", "jev-latest"])
def test_a_model_the_request_names_is_read_as_before(model: str) -> None:
    """An explicit name is kept as sent, as before (the gateway serves its one model whatever
    name is sent, and jevcompat's ``request.model-alias`` needs ``jev-latest`` accepted)."""
    body = {**body_without_model(), "model": model}
    assert request_from_system_one(body, served_models=["gemma-3-270m"]).model == model
    assert request_from_system_one(body).model == model


@pytest.mark.parametrize("model", ["", 5, ["gemma"]])
def test_a_model_that_is_not_a_name_is_refused_as_before(model: Any) -> None:
    body = {**body_without_model(), "model": model}
    with pytest.raises(SystemOneValidationError) as caught:
        request_from_system_one(body, served_models=["gemma-3-270m"])
    assert [entry["loc"] for entry in caught.value.detail] == [["body", "model"]]


def test_a_batch_reads_model_as_the_single_route_does() -> None:
    states = {"states": ["one", "two"], "questions": QUESTIONS}
    assert batch_from_system_one(states, max_states=4, served_models=["m"]).model == "m"
    with pytest.raises(SystemOneValidationError) as caught:
        batch_from_system_one(states, max_states=4, served_models=["a", "b"])
    assert [entry["loc"] for entry in caught.value.detail] == [["body", "model"]]


def test_a_decisions_request_still_names_its_model() -> None:
    """OpenAI's Decisions API requires ``model`` (its official client always sends one): the
    route keeps refusing a request without it."""
    body = {"input": "I was charged twice.", "questions": [{"id": "refund", "type": "boolean",
                                                             "question": "Refund?"}]}  # fmt: skip
    with pytest.raises(DecisionsValidationError) as caught:
        request_from_decisions(body)
    assert ["body", "model"] in [entry["loc"] for entry in caught.value.detail]


@pytest.mark.asyncio
async def test_the_gateway_answers_a_request_and_a_batch_without_model() -> None:
    client, _ = await start()
    try:
        response = await client.post("/v1/systemone", json=body_without_model(), headers=AUTH)
        assert response.status == 200, await response.text()
        body = await response.json()
        assert body["model"] == "stub-model"
        models.SystemOneResponse.model_validate(body)
        batch = {"states": ["one", "two"], "questions": QUESTIONS}
        response = await client.post("/v1/systemone/batch", json=batch, headers=AUTH)
        assert response.status == 200, await response.text()
        assert [set(result) >= {"answers"} for result in (await response.json())["results"]] == [
            True,
            True,
        ]
        named = await client.post("/v1/systemone", json=request_body(model="any"), headers=AUTH)
        assert named.status == 200  # a name the request gives: answered as before
    finally:
        await client.close()


# -- answers ------------------------------------------------------------------------------

_PROBABILITY = {"type": "number", "minimum": 0, "maximum": 1}
_VALUES: dict[str, Any] = {
    "type": {"type": "string"},
    "noul": _PROBABILITY,
    "choice": {"type": "string", "minLength": 1},
    "score": {"type": "number", "minimum": 0},
    "confidence": _PROBABILITY,
    "probabilities": {"type": "object", "additionalProperties": _PROBABILITY},
    "legend": {"type": "object", "additionalProperties": {"type": "string"}},
}


def strict_schema() -> dict[str, Any]:
    """The spec's response as a strict client checks it: each answer exactly its type's fields
    (jevcompat's own list of them, SPEC.md §4), nothing else; ``x_`` fields only at the top
    level (where krite-bench's mapping drops them)."""
    answers = [
        {
            "type": "object",
            "required": sorted(fields),
            "additionalProperties": False,
            "properties": {
                name: {"const": kind} if name == "type" else _VALUES[name] for name in fields
            },
        }
        for kind, fields in SPEC_ANSWER_FIELDS.items()
    ]
    return {
        "type": "object",
        "required": sorted(SPEC_TOP_LEVEL),
        "properties": {
            "model": {"type": "string", "minLength": 1},
            "answers": {"type": "object", "additionalProperties": {"oneOf": answers}},
            "usage": {
                "type": "object",
                "required": ["input_tokens", "output_tokens"],
                "additionalProperties": False,
                "properties": {
                    "input_tokens": {"type": "integer", "minimum": 0},
                    "output_tokens": {"const": 0},
                },
            },
        },
        "patternProperties": {"^x_": {}},
        "additionalProperties": False,
    }


def judged() -> tuple[tv.Judgment, dict[str, tv.Question], dict[str, list[Any]]]:
    call = request_from_system_one({"model": "m", "state": "s", "questions": QUESTIONS})
    answers = {
        "refund": build_answer(call.questions["refund"], [0.25, 0.75]),
        "route": build_answer(call.questions["route"], [0.8, 0.2]),
        "urgency": build_answer(call.questions["urgency"], [0.1, 0.3, 0.6]),
    }
    return tv.Judgment(answers, tv.Usage(12, 0, 3), {}), call.questions, call.score_criteria


def gateway_body(judgment: tv.Judgment, criteria: dict[str, list[Any]]) -> dict[str, Any]:
    from typevet_async._apps.gateway.responses import extension

    return response_to_system_one(
        judgment, "m", score_criteria=criteria, extension=extension(judgment)
    )


def test_every_answer_type_passes_the_official_models_and_a_strict_schema_of_the_spec() -> None:
    judgment, _, criteria = judged()
    body = gateway_body(judgment, criteria)
    parsed = models.SystemOneResponse.model_validate(body)
    assert {kind: type(a.root).__name__ for kind, a in parsed.answers.items()} == {
        "refund": "NoulAnswer", "route": "ChoiceAnswer", "urgency": "ScoreAnswer",
    }  # fmt: skip
    problems = [error.message for error in jsonschema.Draft202012Validator(
        strict_schema()).iter_errors(body)]  # fmt: skip
    assert problems == []
    for qid, answer in body["answers"].items():
        assert set(answer) == SPEC_ANSWER_FIELDS[answer["type"]], qid


def test_the_strict_schema_refuses_an_extra_field_in_an_answer() -> None:
    """The schema is strict where it must be: the answers as sent before (an ``x_`` field
    beside the spec's) fail it, as they failed krite-bench."""
    judgment, _, criteria = judged()
    body = gateway_body(judgment, criteria)
    body["answers"]["route"]["x_entropy_confidence"] = 0.5
    assert not jsonschema.Draft202012Validator(strict_schema()).is_valid(body)


def test_the_entropy_confidence_rides_in_the_extension_and_the_client_reads_it_there() -> None:
    judgment, questions, criteria = judged()
    body = gateway_body(judgment, criteria)
    recorded = body[EXTENSION]["answers"]
    assert recorded["route"]["entropy_confidence"] == entropy_confidence([0.8, 0.2])
    assert recorded["urgency"]["entropy_confidence"] == entropy_confidence([0.1, 0.3, 0.6])
    # The extension's answers are the SDK's own JSON of them (`tv.judgment_to_json`).
    assert recorded == orjson.loads(tv.judgment_to_json(judgment))["answers"]
    back = decode_judgment(orjson.dumps(body), list(questions.items()))
    assert back.answers == judgment.answers
    assert orjson.loads(tv.judgment_to_json(back))["answers"] == recorded
    # The client takes the server's value from there (not only the one it would compute).
    body[EXTENSION]["answers"]["route"]["entropy_confidence"] = 0.25
    back = decode_judgment(orjson.dumps(body), list(questions.items()))
    assert back.answers["route"].entropy_confidence == 0.25


def test_an_extension_answer_to_a_question_not_asked_is_a_protocol_error() -> None:
    judgment, questions, criteria = judged()
    body = gateway_body(judgment, criteria)
    body[EXTENSION]["answers"]["other"] = {"entropy_confidence": 0.5}
    with pytest.raises(tv.ProtocolError, match="not asked"):
        decode_judgment(orjson.dumps(body), list(questions.items()))


@pytest.mark.asyncio
async def test_the_gateways_answers_pass_the_strict_schema() -> None:
    client, _ = await start()
    try:
        response = await client.post("/v1/systemone", json=body_without_model(), headers=AUTH)
        body = await response.json()
    finally:
        await client.close()
    assert list(jsonschema.Draft202012Validator(strict_schema()).iter_errors(body)) == []
    assert {kind for kind in (a["type"] for a in body["answers"].values())} == {
        "noul", "choice", "score",
    }  # fmt: skip
