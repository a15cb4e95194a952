"""`Session.system_one`'s decoding of our gateway's extension, and its handling of what only an
injected fault shows (a 422, a 501, a 503, answers that do not fit the questions).

The reply bodies are the real one recorded from ``typevet-async serve`` in front of the real
llama.cpp server (tests/fixtures/replies/system_one/, scripts/record_replies.py; recorded
before issue 33, so its extension is the old ``typevet`` field and its confidences are the
entropy ones: `current` renames the field as today's gateway sends it), served or changed by
`SystemOneStubServer`: a stub, because no real server answers these faults on
demand. The real path end to end is tests/live/test_system_one_live.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

import typevet_async as tv
from typevet_async._backends.system_one_wire import decode_judgment
from typevet_async._core.wires.system_one import questions_from_system_one

REPLIES = Path(__file__).resolve().parents[1] / "fixtures" / "replies" / "system_one"
RECORDED = (REPLIES / "judgment.json").read_bytes()
REQUEST = json.loads((REPLIES / "requests.json").read_text())["judgment"]["body"]
QUESTIONS = questions_from_system_one(REQUEST)
STATE = REQUEST["state"]
MODELS = {"models": [{"name": "jev-latest", "description": "d", "release_date": "2026-09-15"}]}


def recorded() -> dict[str, Any]:
    body: dict[str, Any] = json.loads(RECORDED)
    return body


def current() -> dict[str, Any]:
    """The recorded reply as today's gateway names its extension: ``x_typevet``."""
    body = recorded()
    body["x_typevet"] = body.pop("typevet")
    return body


@pytest.mark.parametrize("field", ["x_typevet", "typevet"])
def test_the_gateways_extension_gives_back_usage_and_diagnostics(field: str) -> None:
    body = current() if field == "x_typevet" else recorded()  # an older gateway's: typevet
    assert field in body
    judgment = decode_judgment(json.dumps(body).encode(), list(QUESTIONS.items()))
    extension = body[field]
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
    body = current()
    change(body["x_typevet"])
    with pytest.raises(tv.ProtocolError, match=match.replace(".typevet.", ".x_typevet.")) as raised:
        decode_judgment(json.dumps(body).encode(), list(QUESTIONS.items()))
    assert raised.value.payload is not None
    assert len(raised.value.payload) <= 2048


def test_x_typevet_is_read_before_an_old_typevet() -> None:
    body = current()
    body["typevet"] = {"usage": {"prompt_tokens": 1, "cached_tokens": 0, "reads": 1}}
    judgment = decode_judgment(json.dumps(body).encode(), list(QUESTIONS.items()))
    assert judgment.usage == tv.Usage(**body["x_typevet"]["usage"])
    assert judgment.usage.reads == 3


def test_the_servers_confidence_is_read_and_the_entropy_one_is_computed() -> None:
    from typevet_async._core.reading.answers import entropy_confidence, score_confidence

    body = current()
    body["answers"]["route"]["confidence"] = 0.123  # whatever the server's formula gives
    body["answers"]["urgency"]["confidence"] = 0.0
    judgment = decode_judgment(json.dumps(body).encode(), list(QUESTIONS.items()))
    route, urgency, refund = judgment["route"], judgment["urgency"], judgment["refund"]
    assert route.confidence == 0.123
    assert urgency.confidence == 0.0
    sent = body["answers"]["route"]["probabilities"]
    assert route.entropy_confidence == entropy_confidence(list(sent.values()))
    levels = list(body["answers"]["urgency"]["probabilities"].values())
    assert urgency.entropy_confidence == entropy_confidence(levels)
    assert score_confidence(levels) != 0.0  # so the 0.0 read is the server's, not ours
    # A Noul's wire has no confidence: the reference formula's, |2 noul - 1|.
    noul = body["answers"]["refund"]["noul"]
    assert refund.confidence == pytest.approx(abs(2 * noul - 1), abs=1e-15)


@pytest.mark.parametrize(
    ("answers", "probabilities"),
    [
        # three 0.33s: 2 decimals explain a sum of 0.99; divided out to a third each
        ({"route": {"type": "choice", "choice": "billing", "confidence": 0.0,
                    "probabilities": {"billing": 0.33, "shipping": 0.33, "technical": 0.33}}},
         {"route": (1 / 3, 1 / 3, 1 / 3)}),
        ({"route": {"type": "choice", "choice": "shipping", "confidence": 0.6,
                    "probabilities": {"billing": 0.2, "shipping": 0.73, "technical": 0.06}}},
         {"route": (0.2 / 0.99, 0.73 / 0.99, 0.06 / 0.99)}),
        # 3 decimals, and the server's score from its unrounded probabilities
        ({"urgency": {"type": "score", "score": 1.5, "confidence": 0.5,
                      "legend": {"0": "a", "1": "b", "2": "c", "3": "d"},
                      "probabilities": {"0": 0.167, "1": 0.333, "2": 0.333, "3": 0.166}}},
         {"urgency": (0.167 / 0.999, 0.333 / 0.999, 0.333 / 0.999, 0.166 / 0.999)}),
    ],
    ids=["three-thirds", "two-decimals", "three-decimals-score"],
)  # fmt: skip
def test_rounded_probabilities_are_accepted_and_divided_by_their_sum(
    answers: dict[str, Any], probabilities: dict[str, tuple[float, ...]]
) -> None:
    body = current()
    body["answers"].update(answers)
    judgment = decode_judgment(json.dumps(body).encode(), list(QUESTIONS.items()))
    for question_id, expected in probabilities.items():
        got = tuple(judgment[question_id].probabilities.values())
        assert got == pytest.approx(expected, abs=1e-12)
        assert sum(got) == pytest.approx(1.0, abs=1e-12)
        assert judgment[question_id].confidence == answers[question_id]["confidence"]


@pytest.mark.parametrize(
    ("answer", "match"),
    [
        # 2 decimals explain at most 3 x 0.005 (+ 1e-3): 0.98 is not a rounded distribution
        ({"type": "choice", "choice": "billing", "confidence": 0.0,
          "probabilities": {"billing": 0.33, "shipping": 0.33, "technical": 0.32}}, "sum to 0.98"),
        # unrounded values get 1e-3 alone
        ({"type": "choice", "choice": "billing", "confidence": 0.0,
          "probabilities": {"billing": 0.3351, "shipping": 0.3312, "technical": 0.3317}},
         "sum to 0.998"),
        # rounding explains a tie, not a label 0.02 below the top
        ({"type": "choice", "choice": "technical", "confidence": 0.0,
          "probabilities": {"billing": 0.35, "shipping": 0.33, "technical": 0.32}},
         "not the most probable"),
    ],
    ids=["two-decimals-too-far", "unrounded-too-far", "not-the-top"],
)  # fmt: skip
def test_what_rounding_cannot_explain_is_still_refused(answer: dict[str, Any], match: str) -> None:
    body = current()
    body["answers"]["route"] = answer
    with pytest.raises(tv.ProtocolError, match=match) as raised:
        decode_judgment(json.dumps(body).encode(), list(QUESTIONS.items()))
    assert raised.value.question_id == "route"


class SystemOneStubServer:
    """A stub System One server (aiohttp.web) that answers ``POST /v1/systemone`` with the
    queued replies, then the recorded one; it keeps every request it got."""

    def __init__(self) -> None:
        self.replies: list[tuple[int, bytes]] = []
        #: Headers sent with the queued (error) replies.
        self.headers: dict[str, str] = {}
        self.requests: list[tuple[dict[str, str], Any]] = []
        self.url = ""
        #: What ``GET /v1/models`` answers (a test adds advertisements).
        self.models: dict[str, Any] = dict(MODELS)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(self.models)

    async def _judge(self, request: web.Request) -> web.Response:
        self.requests.append((dict(request.headers), await request.json()))
        status, body = self.replies.pop(0) if self.replies else (200, CURRENT)
        headers = self.headers if status != 200 else None
        return web.Response(
            status=status, body=body, content_type="application/json", headers=headers
        )


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


CURRENT = json.dumps(current()).encode()


def session_on(stub: SystemOneStubServer, max_retries: int = 2, **options: Any) -> tv.Session:
    retry = tv.RetryPolicy(max_retries=max_retries)
    http = tv.HttpSettings(api_key="stub-key-1234", retry=retry)
    return tv.Session.system_one(stub.url, http=http, **options)


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
    assert judgment == decode_judgment(CURRENT, list(QUESTIONS.items()))


@pytest.mark.asyncio
async def test_a_529_overloaded_is_retried_after_its_retry_after_ms(
    stub: SystemOneStubServer,
) -> None:
    overloaded = b'{"detail": {"error_type": "overloaded_error", "message": "Overloaded"}}'
    stub.replies.append((529, overloaded))
    stub.headers = {"retry-after-ms": "400", "Retry-After": "5"}
    async with session_on(stub, max_retries=1) as session:
        started = time.monotonic()
        judgment = await session.judge(STATE, QUESTIONS)
        waited = time.monotonic() - started
    assert len(stub.requests) == 2
    assert 0.4 <= waited < 3.0  # the 400 ms asked for, not Retry-After's 5 s
    assert list(judgment) == list(QUESTIONS)


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


def with_examples(count: int) -> dict[str, tv.Question]:
    """The recorded questions, the refund Noul with ``count`` examples."""
    refund = tv.Noul("Refund?", examples=[(f"Ticket {n}", n % 2 == 0) for n in range(count)])
    return {**QUESTIONS, "refund": refund}


@pytest.mark.asyncio
async def test_examples_go_only_to_a_server_that_advertises_reading_them(
    stub: SystemOneStubServer,
) -> None:
    async with session_on(stub) as session:  # no advertisement: it would ignore x_examples
        with pytest.raises(tv.QuestionError, match="does not say it reads them") as raised:
            await session.judge(STATE, with_examples(2))
    assert raised.value.question_id == "refund"
    stub.models = {**MODELS, "x_question_examples": {"field": "x_examples", "max_examples": 1}}
    async with session_on(stub) as session:
        with pytest.raises(tv.QuestionError, match="reads at most 1 a question"):
            await session.judge(STATE, with_examples(2))
        assert stub.requests == []  # nothing was sent
        await session.judge(STATE, with_examples(1))
    [(_, body)] = stub.requests
    assert body["questions"]["refund"]["x_examples"] == [{"state": "Ticket 0", "answer": True}]
    # An advertisement of another field is not ours: nothing is sent there either.
    stub.models = {**MODELS, "x_question_examples": {"field": "examples", "max_examples": 9}}
    async with session_on(stub) as session:
        with pytest.raises(tv.QuestionError, match="does not say it reads them"):
            await session.judge(STATE, with_examples(1))
    assert len(stub.requests) == 1
