"""The official System One client (``typesafe-sdk``, sync and async) against ``typevet-async
serve``'s gateway, run in-process over the real llama.cpp server (Gemma 3 270M)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import typesafe_sdk as ts
from aiohttp import web

import typevet_async as tv
from typevet_async._core.systemone import request_from_system_one
from typevet_async._gateway import GatewayConfig, build_app, runner_options

pytestmark = pytest.mark.live

KEY = "live-gateway-key"
STATE = {"subject": "Duplicate charge", "message": "I was charged twice, please refund me."}
QUESTIONS: dict[str, Any] = {
    "refund": {"type": "noul", "instructions": "Is a refund requested?"},
    "route": {
        "type": "choice",
        "instructions": "Which team should handle it?",
        "criteria": {"billing": "money matters", "shipping": None, "technical": None},
    },
    "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["low", "high"]},
}


@pytest_asyncio.fixture
async def gateway_url(gemma3_url: str) -> AsyncIterator[str]:
    config = GatewayConfig(keys=(KEY,), timeout=120)
    app = build_app(tv.Session.llama_cpp(gemma3_url, reproducible=True), config)
    runner = web.AppRunner(app, **runner_options(config))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    url = f"http://{host}:{port}"
    try:
        yield url
    finally:
        await runner.cleanup()


async def direct_answers(gemma3_url: str) -> dict[str, Any]:
    call = request_from_system_one({"model": "any", "state": STATE, "questions": QUESTIONS})
    async with tv.Session.llama_cpp(gemma3_url, reproducible=True) as session:
        judgment = await session.judge(call.state, call.questions)
    return dict(judgment.answers)


def assert_same(response: ts.SystemOneResponse, direct: dict[str, Any]) -> None:
    assert response.nouls["refund"].noul == pytest.approx(direct["refund"].noul, abs=1e-6)
    route = response.choices["route"]
    assert route.choice == direct["route"].choice
    for label, p in direct["route"].probabilities.items():
        assert route.probabilities[label] == pytest.approx(p, abs=1e-6)
    assert response.scores["urgency"].score == pytest.approx(direct["urgency"].score, abs=1e-6)


NO_RETRY = ts.RetryPolicy(max_retries=0)


@pytest.mark.asyncio
async def test_the_async_client_gets_the_direct_answers(gateway_url: str, gemma3_url: str) -> None:
    direct = await direct_answers(gemma3_url)
    async with ts.AsyncTypeSafeClient(api_key=KEY, base_url=gateway_url, retry=NO_RETRY) as c:
        response = await c.system_one(state=STATE, questions=QUESTIONS, model="gemma-3-270m")
        listed = await c.models.list()
    assert_same(response, direct)
    assert [m.name for m in listed.models]


@pytest.mark.asyncio
async def test_the_sync_client_gets_the_direct_answers(gateway_url: str, gemma3_url: str) -> None:
    direct = await direct_answers(gemma3_url)

    def ask() -> ts.SystemOneResponse:
        with ts.TypeSafeClient(api_key=KEY, base_url=gateway_url, retry=NO_RETRY) as client:
            return client.system_one(state=STATE, questions=QUESTIONS, model="gemma-3-270m")

    assert_same(await asyncio.to_thread(ask), direct)


@pytest.mark.asyncio
async def test_a_wrong_key_is_the_clients_auth_error(gateway_url: str) -> None:
    async with ts.AsyncTypeSafeClient(
        api_key="wrong", base_url=gateway_url, retry=NO_RETRY
    ) as client:
        with pytest.raises(ts.TypeSafeAuthenticationError) as raised:
            await client.system_one(state=STATE, questions=QUESTIONS)
    assert raised.value.status == 401


@pytest.mark.asyncio
async def test_bad_questions_are_the_clients_validation_error(gateway_url: str) -> None:
    bad = {"q": {"type": "score", "instructions": "How?", "criteria": ["only one"]}}

    def ask() -> None:
        with ts.TypeSafeClient(api_key=KEY, base_url=gateway_url, retry=NO_RETRY) as client:
            client.system_one(state=STATE, questions=bad)

    with pytest.raises(ts.TypeSafeUnprocessableEntityError) as raised:
        await asyncio.to_thread(ask)
    assert raised.value.status == 422


@pytest.mark.asyncio
async def test_the_clients_zstd_bodies_are_read(gateway_url: str) -> None:
    from typesafe_sdk._core.compression import MIN_COMPRESSED_BODY_LENGTH, resolve_compression

    assert resolve_compression(None) == "zstd"  # backports.zstd is installed: it compresses
    state = {**STATE, "history": "Earlier: asked about delivery. " * 40}
    assert len(str(state)) > MIN_COMPRESSED_BODY_LENGTH
    async with ts.AsyncTypeSafeClient(api_key=KEY, base_url=gateway_url, retry=NO_RETRY) as c:
        response = await c.system_one(state=state, questions=QUESTIONS, timeout=120)
    assert 0 <= response.nouls["refund"].noul <= 1
