"""``POST /v1/systemone/batch`` with real parts (issue 33 part 5): our gateway in-process over
the real llama.cpp server (Gemma 3 270M, reproducible reads) and once over vLLM, and
`Session.system_one` sending ``judge_many`` through it; the fall back to one request per state
against jevcompat's ``mock`` reference server, which has no batch route.

Every answer is held to the reference of the same reads: the single route's body for that
state, and a direct session's ``judge`` (within 1e-6, reproducible mode on both sides).
"""

from __future__ import annotations

import asyncio
import gzip
import math
import re
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio

import typevet_async as tv
from typevet_async._apps.gateway import GatewayConfig, running
from typevet_async._backends.system_one import AsyncSystemOne
from typevet_async._core.wires.system_one import (
    BATCH_PATH,
    batch_to_system_one,
    request_to_system_one,
)

from .faults import AdvertisingProxy, counting_tasks
from .helpers import wait_until_ready
from .servers import VLLM_MODEL_ID
from .test_gateway_hostile_live import LAG_BOUND, Ticker
from .test_jevcompat_live import KEY as MOCK_KEY
from .test_jevcompat_live import MockServer
from .test_system_one_live import QUESTIONS, TICKETS, assert_same_judgment

pytestmark = pytest.mark.live

KEY = "live-batch-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
CAP = 4
LONG_TICKET = {"subject": "Log", "message": "word " * 9_000}  # past the 8,192-token context


@pytest_asyncio.fixture
async def gateway_url(gemma3_url: str) -> AsyncIterator[str]:
    session = tv.Session.llama_cpp(gemma3_url, reproducible=True)
    config = GatewayConfig(keys=(KEY,), request_deadline=180, max_batch_states=CAP)
    async with running(session, config) as url:
        await wait_until_ready(url)
        yield url


async def post(url: str, path: str, body: Any, **headers: str) -> tuple[int, Any, float]:
    """Status, parsed body and seconds of one POST with the key."""
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    started = time.perf_counter()
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{url}{path}", data=data, headers={**AUTH, **headers}) as response,
    ):
        parsed = await response.json(content_type=None)
        assert response.headers["x-typesafe-request-id"].startswith("req_")
        return response.status, parsed, time.perf_counter() - started


async def route_counts(url: str) -> dict[str, float]:
    """The gateway's answered requests by route (its Prometheus counter)."""
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as response:
        text = await response.text()
    counts: dict[str, float] = {}
    pattern = r'typevet_gateway_requests_total\{route="([^"]+)",status="\d+"\} (\S+)'
    for route, value in re.findall(pattern, text):
        counts[route] = counts.get(route, 0.0) + float(value)
    return counts


def assert_same_answers(got: dict[str, Any], expected: dict[str, Any]) -> None:
    """Two System One answer maps: same ids and types, values within 1e-6."""
    assert list(got) == list(expected)
    for question_id, answer in expected.items():
        mine = got[question_id]
        assert mine["type"] == answer["type"]
        for key in ("noul", "score", "confidence"):
            if key in answer:
                assert mine[key] == pytest.approx(answer[key], abs=1e-6)
        if "probabilities" in answer:
            assert mine["probabilities"] == pytest.approx(answer["probabilities"], abs=1e-6)


@pytest.mark.asyncio
async def test_batch_results_are_the_single_routes_and_the_direct_judgments(
    gateway_url: str, gemma3_url: str
) -> None:
    states = TICKETS[:CAP]
    wire = request_to_system_one("gemma", states[0], QUESTIONS)["questions"]
    status, body, seconds = await post(
        gateway_url, BATCH_PATH, batch_to_system_one("gemma", states, QUESTIONS)
    )
    assert status == 200
    assert len(body["results"]) == len(states)
    print(f"batch of {len(states)} states: {seconds:.2f} s")
    async with tv.Session.llama_cpp(gemma3_url, reproducible=True) as direct:
        for state, result in zip(states, body["results"], strict=True):
            single_status, single, _ = await post(
                gateway_url, "/v1/systemone", {"model": "g", "state": state, "questions": wire}
            )
            assert single_status == 200
            assert_same_answers(result["answers"], single["answers"])
            assert result["usage"] == single["usage"]
            assert result["x_typevet"]["diagnostics"] == single["x_typevet"]["diagnostics"]
            judgment = await direct.judge(state, QUESTIONS)
            for question_id, answer in judgment.items():
                sent = result["answers"][question_id]
                if isinstance(answer, tv.NoulAnswer):  # a Noul's wire carries P(true) only
                    assert sent["noul"] == pytest.approx(answer.noul, abs=1e-6)
                    continue
                expected = {str(k): p for k, p in answer.probabilities.items()}
                assert sent["probabilities"] == pytest.approx(expected, abs=1e-6)
    total = sum(result["usage"]["input_tokens"] for result in body["results"])
    assert body["usage"] == {"input_tokens": total, "output_tokens": 0}


@pytest.mark.asyncio
async def test_a_bad_state_among_good_ones_fails_only_its_item(gateway_url: str) -> None:
    states = [TICKETS[0], 42, LONG_TICKET, TICKETS[1]]
    status, body, _ = await post(
        gateway_url, BATCH_PATH, batch_to_system_one("gemma", states, QUESTIONS)
    )
    assert status == 200
    results = body["results"]
    assert "answers" in results[0]
    assert "answers" in results[3]
    not_a_state = results[1]["error"]
    assert (not_a_state["status"], not_a_state["loc"]) == (422, ["body", "states", 1])
    too_long = results[2]["error"]
    assert (too_long["status"], too_long["error_type"]) == (422, "upstream_refused")
    assert "context" in too_long["message"]
    wire = request_to_system_one("g", TICKETS[1], QUESTIONS)
    _, single, _ = await post(gateway_url, "/v1/systemone", wire)
    assert_same_answers(results[3]["answers"], single["answers"])


@pytest.mark.asyncio
async def test_judge_many_goes_through_the_batch_route_with_the_direct_answers(
    gateway_url: str, gemma3_url: str
) -> None:
    async with tv.Session.llama_cpp(gemma3_url, reproducible=True) as direct_session:
        direct = [item async for item in direct_session.judge_many(TICKETS, QUESTIONS)]
    before = await route_counts(gateway_url)
    started = time.perf_counter()
    async with tv.Session.system_one(gateway_url, http=tv.HttpSettings(api_key=KEY)) as session:
        items = [item async for item in session.judge_many(TICKETS, QUESTIONS)]
        backend = session.backend
        assert isinstance(backend, AsyncSystemOne)
        assert backend.batch_limit == CAP  # as GET /v1/models advertises it
    seconds = time.perf_counter() - started
    after = await route_counts(gateway_url)
    sent = {route: after.get(route, 0) - before.get(route, 0) for route in after}
    print(f"judge_many of {len(TICKETS)} through the batch route: {seconds:.2f} s, {sent}")
    assert sent.get(BATCH_PATH) == math.ceil(len(TICKETS) / CAP)
    assert sent.get("/v1/systemone", 0) == 0
    assert [item.index for item in items] == list(range(len(TICKETS)))
    for item, expected in zip(items, direct, strict=True):
        assert item.judgment is not None, item.error
        assert expected.judgment is not None, expected.error
        assert_same_judgment(item.judgment, expected.judgment)


@pytest.mark.asyncio
async def test_an_advertised_300000_is_capped_and_3_records_are_3_workers_and_one_batch(
    gateway_url: str, gemma3_url: str
) -> None:
    # Issue 43.4: the real gateway over the real server, behind a proxy whose only stub is
    # its advertisement (300,000 states a batch; the gateway itself takes 4).
    states = TICKETS[:3]
    async with (
        AdvertisingProxy(gateway_url, 300_000) as proxy,
        tv.Session.system_one(proxy.url, http=tv.HttpSettings(api_key=KEY)) as session,
    ):
        with counting_tasks() as created:
            items = [item async for item in session.judge_many(states, QUESTIONS)]
        backend = session.backend
        assert isinstance(backend, AsyncSystemOne)
        limit = backend.batch_limit
    workers = created["typevet_async._session.batch._Engine._work"]
    print(f"3 records, 300,000 advertised: {workers} workers, {sum(created.values())} tasks, "
          f"batches {proxy.states_per_batch()}")  # fmt: skip
    assert workers == 3  # was 300,000: 16-18 s and 1 GB in the issue
    assert limit == 64  # the client's cap, not the advertisement
    assert sum(created.values()) < 60, created  # the client's, the proxy's and the gateway's
    assert proxy.states_per_batch() == [3]
    assert proxy.count("/v1/systemone") == 0
    async with tv.Session.llama_cpp(gemma3_url, reproducible=True) as direct:
        for item, state in zip(items, states, strict=True):
            assert item.judgment is not None, item.error
            assert_same_judgment(item.judgment, await direct.judge(state, QUESTIONS))


@pytest.mark.asyncio
async def test_judge_many_keeps_a_refused_record_as_its_own_error(gateway_url: str) -> None:
    records = [TICKETS[0], LONG_TICKET, TICKETS[2]]
    async with tv.Session.system_one(gateway_url, http=tv.HttpSettings(api_key=KEY)) as session:
        items = [item async for item in session.judge_many(records, QUESTIONS)]
    assert [item.judgment is not None for item in items] == [True, False, True]
    error = items[1].error
    assert isinstance(error, tv.InvalidInputError)
    assert not isinstance(error, tv.QuestionError)
    assert "refused this record (HTTP 422)" in str(error)
    assert "context" in str(error)


@pytest.mark.asyncio
async def test_hostile_batches_are_typed_4xx_at_once_while_a_judgment_goes_on(
    gateway_url: str,
) -> None:
    questions = orjson.dumps(batch_to_system_one("g", [], QUESTIONS)["questions"])
    # orjson writes at most 254 levels: the deep body is written by hand
    deep = b'{"model": "g", "states": [' + b"[" * 500 + b'"x"' + b"]" * 500
    deep += b'], "questions": ' + questions + b"}"
    bomb = gzip.compress(orjson.dumps(batch_to_system_one("g", ["y" * (9 << 20)], QUESTIONS)))
    many, past_cap = (batch_to_system_one("g", ["x"] * n, QUESTIONS) for n in (100_000, CAP + 1))
    # bytes, written before the ticker starts: it measures the gateway's work, not the client's
    cases = [
        ("100,000 states", orjson.dumps(many), {}, 422, "too_long"),
        ("one state past the cap", orjson.dumps(past_cap), {}, 422, "too_long"),
        ("a state 500 levels deep", deep, {}, 422, "budget_exceeded"),
        ("a gzip body of 9 MiB", bomb, {"Content-Encoding": "gzip"}, 413, "too_large"),
    ]
    wire = request_to_system_one("g", TICKETS[0], QUESTIONS)
    async with Ticker() as ticker:
        beside = asyncio.create_task(post(gateway_url, "/v1/systemone", wire))
        for what, body, headers, expected, kind in cases:
            status, answer, seconds = await post(gateway_url, BATCH_PATH, body, **headers)
            print(f"{what}: {status} in {seconds * 1000:.0f} ms")
            assert status == expected, answer
            detail = answer["detail"]
            assert (detail[0]["type"] if status == 422 else detail["error_type"]) == kind
            assert seconds < 5.0
        status, judged, _ = await beside
    print(f"the gateway's loop was late by {ticker.worst * 1000:.1f} ms at worst")
    assert ticker.worst < LAG_BOUND
    assert status == 200
    assert list(judged["answers"]) == list(QUESTIONS)


@pytest.fixture
def mock_url() -> Iterator[str]:
    server = MockServer()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.mark.asyncio
async def test_against_a_server_without_the_route_each_state_is_sent_alone(mock_url: str) -> None:
    states = [TICKETS[0], "Where is my parcel?", ["Line one.", "The app crashes."]]
    headers = {"Authorization": f"Bearer {MOCK_KEY}"}
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{mock_url}/v1/models", headers=headers) as response:
            assert "x_systemone_batch" not in await response.json()
        body = batch_to_system_one("jev-latest", states, QUESTIONS)
        async with http.post(f"{mock_url}{BATCH_PATH}", json=body, headers=headers) as response:
            assert response.status in (404, 405)  # the route is not there
    async with tv.Session.system_one(mock_url, http=tv.HttpSettings(api_key=MOCK_KEY)) as session:
        items = [item async for item in session.judge_many(states, QUESTIONS)]
        backend = session.backend
        assert isinstance(backend, AsyncSystemOne)
        assert backend.batch_limit is None
        alone = [await session.judge(state, QUESTIONS) for state in states]
    assert [item.index for item in items] == [0, 1, 2]
    for item, expected in zip(items, alone, strict=True):
        assert item.judgment is not None, item.error
        assert item.judgment.answers == expected.answers  # the mock answers by formula


# -- over vLLM ---------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_over_vllm_judge_many_through_the_batch_route_gives_the_direct_answers(
    vllm_url: str,
) -> None:
    # One read at a time on both sides, every prompt read once before (test_gateway_live.py).
    def direct_session() -> tv.Session:
        return tv.Session.vllm(vllm_url, model=VLLM_MODEL_ID, max_concurrency=1)

    states = TICKETS[:3]
    async with direct_session() as warm:
        [await warm.judge(state, QUESTIONS) for state in states]
    config = GatewayConfig(keys=(KEY,), request_deadline=300, max_batch_states=CAP)
    async with running(direct_session(), config) as url:
        await wait_until_ready(url, 300)
        async with tv.Session.system_one(url, http=tv.HttpSettings(api_key=KEY)) as session:
            items = [item async for item in session.judge_many(states, QUESTIONS)]
        sent = await route_counts(url)
    async with direct_session() as direct:
        expected = [await direct.judge(state, QUESTIONS) for state in states]
    assert sent.get(BATCH_PATH) == 1
    assert sent.get("/v1/systemone", 0) == 0
    for item, judgment in zip(items, expected, strict=True):
        assert item.judgment is not None, item.error
        assert_same_judgment(item.judgment, judgment)
