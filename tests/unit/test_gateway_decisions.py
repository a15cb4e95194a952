"""The gateway's ``POST /v1/decisions`` over the in-memory stub backend, through aiohttp's test
server (real HTTP on localhost): responses the ``openai`` client's own types accept, errors in
OpenAI's shape on this route only, and the route in the metrics."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest
from openai.types.decision import Decision

import typevet_async as tv
from typevet_async._apps.gateway import GatewayConfig, running
from typevet_async._backends.openai_decisions import _refused

from .stubs import InMemoryStubBackend
from .test_gateway import AUTH, KEY, assert_error_shape, request_body, start

BODY: dict[str, Any] = {
    "model": "gemma-3-270m",
    "input": "charged twice",
    "questions": [
        {"type": "predicate", "name": "refund", "instructions": "Is a refund requested?"},
        {
            "type": "choice",
            "instructions": "Angry?",
            "choices": [{"value": True}, {"value": False}],
        },
    ],
}


def assert_openai_error(body: Any, kind: str) -> None:
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == kind
    assert body["error"]["message"]


@pytest.mark.asyncio
async def test_a_request_gets_a_decision_in_question_order() -> None:
    client, _ = await start()
    try:
        response = await client.post("/v1/decisions", json=BODY, headers=AUTH)
        assert response.status == 200
        decision = Decision.model_validate(await response.json())
        assert [a.type for a in decision.answers] == ["predicate", "choice"]
        assert decision.answers[1].choice in (True, False)
        assert decision.model == "stub-model"
        assert response.headers["x-typesafe-request-id"].startswith("req_")
        text = await (await client.get("/metrics")).text()
        assert 'typevet_gateway_requests_total{route="/v1/decisions",status="200"} 1.0' in text
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_errors_on_the_route_are_in_openais_shape_and_elsewhere_unchanged() -> None:
    client, _ = await start()
    try:
        denied = await client.post("/v1/decisions", json=BODY)
        assert denied.status == 401
        assert_openai_error(await denied.json(), "authentication_error")
        bad = await client.post("/v1/decisions", json={**BODY, "questions": []}, headers=AUTH)
        assert bad.status == 422
        body = await bad.json()
        assert_openai_error(body, "invalid_request_error")
        assert body["error"]["param"] == "questions"
        multipart = {**AUTH, "Content-Type": "multipart/form-data; boundary=x"}
        refused = await client.post("/v1/decisions", data=b"--x--", headers=multipart)
        assert refused.status == 415
        assert_openai_error(await refused.json(), "invalid_request_error")
        wrong_method = await client.get("/v1/decisions", headers=AUTH)
        assert wrong_method.status == 405
        assert_openai_error(await wrong_method.json(), "invalid_request_error")
        system_one = await client.post("/v1/systemone", json=request_body(questions={}))
        assert system_one.status == 401
        assert_error_shape(await system_one.json(), 401)
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_session_openai_decisions_through_the_gateway_equals_the_direct_session() -> None:
    questions: dict[str, tv.Question] = {
        "refund": tv.Noul("Is a refund requested?"),
        "route": tv.Choice({"billing": "money", "shipping": None}, instructions="Team?"),
        "urgency": tv.Score(["low", "high"], instructions="How urgent?"),
    }
    config = GatewayConfig(keys=(KEY,), probe_interval=0.01)
    async with tv.Session(InMemoryStubBackend()) as direct:
        expected = await direct.judge({"ticket": "charged twice"}, questions)
    async with running(tv.Session(InMemoryStubBackend()), config) as url:
        async with aiohttp.ClientSession() as http:
            for _ in range(200):  # the probe runs in the background after startup
                async with http.get(f"{url}/readyz") as ready:
                    if ready.status == 200:
                        break
                await asyncio.sleep(0.01)
        async with tv.Session.openai_decisions(
            url,
            http=tv.HttpSettings(api_key=KEY, retry=tv.RetryPolicy(max_retries=0)),
        ) as remote:
            judged = await remote.judge({"ticket": "charged twice"}, questions)
    for qid, answer in expected.items():
        for key, p in answer.probabilities.items():
            assert judged[qid].probabilities[key] == pytest.approx(p, abs=1e-15)
    assert judged.usage.prompt_tokens == expected.usage.prompt_tokens


def test_a_decisions_session_refuses_what_the_server_decides() -> None:
    with pytest.raises(tv.ConfigurationError, match="Decisions session"):
        tv.Session.openai_decisions("http://127.0.0.1:9", off_menu_threshold=0.5)


# -- issue 43.8: a question refused while judging, one spelling, and the client stops once ----

#: 12 values: past the stub's 10 digit controls, so the question is refused while judging
#: (planning its reads), not by the route's validation.
WIDE: dict[str, Any] = {
    "type": "choice",
    "instructions": "Which queue?",
    "choices": [{"value": f"queue {n}"} for n in range(12)],
}


async def ready(url: str) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(200):  # the probe runs in the background after startup
            async with http.get(f"{url}/readyz") as answer:
                if answer.status == 200:
                    return
            await asyncio.sleep(0.01)


async def decisions_422s(url: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as response:
        text = await response.text()
    line = 'typevet_gateway_requests_total{route="/v1/decisions",status="422"} '
    return sum(float(row[len(line) :]) for row in text.splitlines() if row.startswith(line))


@pytest.mark.asyncio
async def test_a_question_refused_while_judging_is_named_as_the_route_names_it() -> None:
    client, _ = await start()
    try:
        body = {**BODY, "questions": [WIDE, BODY["questions"][0]]}
        refused = await client.post("/v1/decisions", json=body, headers=AUTH)
        assert refused.status == 422
        error = (await refused.json())["error"]
        assert error["param"] == "questions[0]"  # was "questions.0"
        assert error["type"] == "invalid_request_error"
        assert error["code"] == "value_error"
        assert error["message"].startswith("questions[0]: ")
        assert "12 options" in error["message"]
        invalid = {**BODY, "questions": [{**WIDE, "choices": []}]}
        validated = await client.post("/v1/decisions", json=invalid, headers=AUTH)
        assert (await validated.json())["error"]["param"] == "questions[0].choices"
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_the_sdk_stops_a_batch_once_on_a_question_refused_while_judging() -> None:
    questions: dict[str, tv.Question] = {
        "refund": tv.Noul("Is a refund requested?"),
        "queue": tv.Choice([f"queue {n}" for n in range(12)], instructions="Which queue?"),
    }
    config = GatewayConfig(keys=(KEY,), probe_interval=0.01)
    async with running(tv.Session(InMemoryStubBackend()), config) as url:
        await ready(url)
        async with tv.Session.openai_decisions(
            url,
            http=tv.HttpSettings(api_key=KEY, retry=tv.RetryPolicy(max_retries=0)),
        ) as remote:
            with pytest.raises(tv.QuestionError, match="refused the request") as raised:
                async for _ in remote.judge_many(
                    [f"ticket {n}" for n in range(6)], questions, max_in_flight=1
                ):
                    pass
        assert raised.value.question_id == "queue"
        # one request, as for a validation error; before: 6 requests, 6 InvalidInputError items
        assert await decisions_422s(url) == 1


@pytest.mark.parametrize(
    ("param", "question_id"),
    [
        ("questions[1]", "queue"),
        ("questions[1].choices", "queue"),
        ("questions.1", "queue"),  # a gateway before issue 43
        ("questions[7]", None),  # no such question: the record's own
        ("questions", None),
        ("input", None),
        (None, None),
    ],
)
def test_the_client_reads_which_question_a_refusal_names(
    param: str | None, question_id: str | None
) -> None:
    questions = [
        ("refund", tv.Noul("Refund?")),
        ("queue", tv.Choice(["a", "b"], instructions="Q?")),
    ]
    body = orjson.dumps({"error": {"message": "no", "type": "invalid_request_error",
                                   "param": param, "code": "x"}}).decode()  # fmt: skip
    with pytest.raises(tv.InvalidInputError) as raised:
        _refused(tv.ServerError("HTTP 422", status=422, body=body), questions)
    assert isinstance(raised.value, tv.QuestionError) == (question_id is not None)
    assert getattr(raised.value, "question_id", None) == question_id
