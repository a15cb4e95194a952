"""`Session.system_one`'s decoding of our gateway's extension, and its handling of what only an
injected fault shows (a 422, a 501, a 503, answers that do not fit the questions).

The reply bodies are the real one recorded from ``typevet-async serve`` in front of the real
llama.cpp server (tests/fixtures/replies/system_one/, scripts/record_replies.py), served or
changed by `SystemOneStubServer`: a stub, because no real server answers these faults on
demand. The real path end to end is tests/live/test_system_one_live.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

import typevet_async as tv
from typevet_async._backends.system_one_wire import decode_judgment
from typevet_async._core.systemone import questions_from_system_one

REPLIES = Path(__file__).resolve().parents[1] / "fixtures" / "replies" / "system_one"
RECORDED = (REPLIES / "judgment.json").read_bytes()
REQUEST = json.loads((REPLIES / "requests.json").read_text())["judgment"]["body"]
QUESTIONS = questions_from_system_one(REQUEST)
STATE = REQUEST["state"]
MODELS = {"models": [{"name": "jev-latest", "description": "d", "release_date": "2026-09-15"}]}


def recorded() -> dict[str, Any]:
    body: dict[str, Any] = json.loads(RECORDED)
    return body


def test_the_gateways_extension_gives_back_usage_and_diagnostics() -> None:
    judgment = decode_judgment(RECORDED, list(QUESTIONS.items()))
    extension = recorded()["typevet"]
    assert judgment.usage == tv.Usage(**extension["usage"])
    assert judgment.usage.reads == 3  # the server-side reads, one per question
    assert list(judgment.diagnostics) == ["refund", "route", "urgency"]
    route = judgment.diagnostics["route"]
    assert route.prompt == extension["diagnostics"]["route"]["prompt"]
    assert len(route.token_ids) == 3
    # The answers are rebuilt from the wire's probabilities, not taken from the extension.
    answer = judgment["route"]
    assert isinstance(answer, tv.ChoiceAnswer)
    assert dict(answer.probabilities) == recorded()["answers"]["route"]["probabilities"]


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda e: e.update(diagnostics={"route": "x"}), "unexpected reply"),
        (lambda e: e.update(diagnostics={"other": e["diagnostics"]["route"]}), "not asked"),
        (lambda e: e.update(usage={"prompt_tokens": "many"}), "unexpected reply"),
        (lambda e: e.update(usage=[1, 2]), "unexpected reply"),
        # accepted before: negative counts, and numbers coerced to counts
        (lambda e: e.update(usage={"prompt_tokens": -5, "cached_tokens": 99, "reads": -1}),
         r"Expected `int` >= 0 - at `\$.typevet.usage.prompt_tokens`"),
        (lambda e: e["usage"].update(reads=1.9), "Expected `int`, got `float`"),
        (lambda e: e["usage"].update(reads="7"), "Expected `int`, got `str`"),
        (lambda e: e["usage"].update(reads=True), "Expected `int`, got `bool`"),
        (lambda e: e["diagnostics"]["route"].update(token_ids=[-1, 2, 3]), "token_ids"),
        (lambda e: e["diagnostics"]["route"]["logprobs"].__setitem__(0, 5.0), "logprobs"),
        (lambda e: e["diagnostics"]["route"].update(off_menu_mass=-3.0), "off_menu_mass"),
        (lambda e: e["diagnostics"]["route"].update(token_ids=[1]), "differ in length"),
    ],
    ids=[
        "diagnostics-not-records", "diagnostics-of-another-question", "usage-text", "usage-list",
        "usage-negative", "usage-float", "usage-string", "usage-bool", "token-id-negative",
        "logprob-positive", "off-menu-negative", "lengths-differ",
    ],
)  # fmt: skip
def test_an_extension_that_is_not_ours_is_a_protocol_error(
    change: Callable[[dict[str, Any]], None], match: str
) -> None:
    body = recorded()
    change(body["typevet"])
    with pytest.raises(tv.ProtocolError, match=match) as raised:
        decode_judgment(json.dumps(body).encode(), list(QUESTIONS.items()))
    assert raised.value.payload is not None
    assert len(raised.value.payload) <= 2048


class SystemOneStubServer:
    """A stub System One server (aiohttp.web) that answers ``POST /v1/systemone`` with the
    queued replies, then the recorded one; it keeps every request it got."""

    def __init__(self) -> None:
        self.replies: list[tuple[int, bytes]] = []
        self.requests: list[tuple[dict[str, str], Any]] = []
        self.url = ""

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(MODELS)

    async def _judge(self, request: web.Request) -> web.Response:
        self.requests.append((dict(request.headers), await request.json()))
        status, body = self.replies.pop(0) if self.replies else (200, RECORDED)
        return web.Response(status=status, body=body, content_type="application/json")


@pytest_asyncio.fixture
async def stub() -> AsyncIterator[SystemOneStubServer]:
    server = SystemOneStubServer()
    app = web.Application()
    app.router.add_get("/v1/models", server._models)
    app.router.add_post("/v1/systemone", server._judge)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    server.url = f"http://{host}:{port}"
    try:
        yield server
    finally:
        await runner.cleanup()


def session_on(stub: SystemOneStubServer, **options: Any) -> tv.Session:
    options.setdefault("api_key", "stub-key-1234")
    return tv.Session.system_one(stub.url, **options)


def refusal(loc: list[Any], msg: str) -> bytes:
    return json.dumps({"detail": [{"loc": loc, "msg": msg, "type": "value_error"}]}).encode()


@pytest.mark.asyncio
async def test_one_request_per_judgment_in_the_system_one_shape(stub: SystemOneStubServer) -> None:
    state = {"ticket": STATE, "tags": ["billing"]}
    async with session_on(stub) as session:
        judgment = await session.judge(state, QUESTIONS)
    [(headers, body)] = stub.requests
    assert headers["Authorization"] == "Bearer stub-key-1234"
    assert body["model"] == "jev-latest"  # none pinned: the first the server lists
    assert body["state"] == state  # sent as the caller gave it
    assert body["questions"]["urgency"]["criteria"] == REQUEST["questions"]["urgency"]["criteria"]
    assert list(judgment) == list(QUESTIONS)


@pytest.mark.asyncio
async def test_a_422_is_a_question_error_naming_the_question(stub: SystemOneStubServer) -> None:
    stub.replies.append((422, refusal(["body", "questions", "route"], "too many options")))
    async with session_on(stub, max_retries=3) as session:
        with pytest.raises(tv.QuestionError, match="too many options") as raised:
            await session.judge(STATE, QUESTIONS)
    assert raised.value.question_id == "route"
    assert len(stub.requests) == 1  # not retried


@pytest.mark.asyncio
async def test_a_501_is_unsupported_and_ends_a_batch_once(stub: SystemOneStubServer) -> None:
    stub.replies.append((501, refusal(["body", "model"], "Gemma is not a decision model")))
    async with session_on(stub, max_retries=3) as session:
        with pytest.raises(tv.UnsupportedTemplateError, match="does not judge with model"):
            async for _ in session.judge_many([STATE] * 5, QUESTIONS, max_in_flight=1):
                pass
    assert len(stub.requests) == 1  # not retried, and no further record was sent


@pytest.mark.asyncio
async def test_a_503_is_retried(stub: SystemOneStubServer) -> None:
    stub.replies.append((503, b'{"detail": "busy"}'))
    async with session_on(stub, max_retries=2) as session:
        judgment = await session.judge(STATE, QUESTIONS)
    assert len(stub.requests) == 2
    assert judgment == decode_judgment(RECORDED, list(QUESTIONS.items()))


@pytest.mark.asyncio
async def test_answers_that_do_not_fit_the_questions_are_refused(
    stub: SystemOneStubServer,
) -> None:
    body = recorded()
    del body["answers"]["urgency"]
    stub.replies.append((200, json.dumps(body).encode()))
    async with session_on(stub) as session:
        with pytest.raises(tv.ProtocolError, match="missing") as raised:
            await session.judge(STATE, QUESTIONS)
    assert raised.value.question_id == "urgency"


@pytest.mark.asyncio
async def test_a_pinned_model_is_sent_and_checked(stub: SystemOneStubServer) -> None:
    async with session_on(stub, model="jev-latest") as session:
        await session.judge(STATE, QUESTIONS)
        with pytest.raises(tv.ConfigurationError, match="pinned to model"):
            await session.judge(STATE, QUESTIONS, model="another")
    assert [body["model"] for _, body in stub.requests] == ["jev-latest"]
    async with session_on(stub, model="not-listed") as session:
        with pytest.raises(tv.ConfigurationError, match="not-listed"):
            await session.probe()


def test_bad_factory_arguments_are_configuration_errors() -> None:
    with pytest.raises(tv.ConfigurationError, match="base_url"):
        tv.Session.system_one("")
    with pytest.raises(tv.ConfigurationError):
        tv.Session.system_one("http://h", model="")
    for setting in ({"layout": tv.Layout.SPLIT}, {"prefix_reuse": "off"}):
        with pytest.raises(tv.ConfigurationError, match="frames and reads the questions"):
            tv.Session.system_one("http://h", **setting)
