"""What no read can answer is refused before anything is sent to the real llama.cpp server
(Gemma 3 270M, ``gemma3_url``: n_ctx 8,192 over 4 slots, 2,048 tokens a request): a state far
past the served context, through the SDK and through the gateway, and a Choice past the most
options two-token codes reach. `FaultInjectingProxy` (tests/live/faults.py), with no fault
scripted, forwards every request to the real server and records its path: the tests count what
reached the server after the probe."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator

import aiohttp
import orjson
import pytest
import pytest_asyncio

import typevet_async as tv
from typevet_async._apps.gateway import GatewayConfig, running

from .faults import FaultInjectingProxy
from .helpers import TICKET, wait_until_ready

pytestmark = [pytest.mark.live, pytest.mark.asyncio]

#: About 7 MB of plain text: about 1.7 million Gemma tokens, against a slot's 2,048. Sent to
#: the server, llama.cpp tokenises all of it before refusing (118 s measured here), so a
#: judgment waited for its deadline.
SEVEN_MB = (TICKET + " ") * (7_000_000 // (len(TICKET) + 1))
#: Long enough that a refusal by the server could not come first (the probe's figure is what
#: the test asserts; a deadline here would mean the prompt was sent).
TIMEOUT = 60.0
QUESTION = tv.Choice({"billing": None, "shipping": None}, instructions="Which team?")
KEY = "live-limits-key"


@pytest_asyncio.fixture
async def proxied(gemma3_url: str) -> AsyncIterator[tuple[FaultInjectingProxy, tv.Session]]:
    """A session on the real server through the recording proxy, probed."""
    async with (
        FaultInjectingProxy(gemma3_url) as proxy,
        tv.Session.llama_cpp(proxy.url) as session,
    ):
        await session.probe()
        yield proxy, session


async def test_the_probe_reads_a_slots_context_from_props(
    proxied: tuple[FaultInjectingProxy, tv.Session],
) -> None:
    _, session = proxied
    probe = await session.probe()
    assert probe.context_tokens == 2048  # n_ctx 8,192 shared by 4 slots


async def test_a_state_far_past_the_context_is_refused_with_nothing_sent(
    proxied: tuple[FaultInjectingProxy, tv.Session],
) -> None:
    proxy, session = proxied
    before = len(proxy.paths)
    with pytest.raises(tv.PromptTooLongError) as refused:
        await session.judge(SEVEN_MB, {"route": QUESTION}, timeout=TIMEOUT)
    assert proxy.paths[before:] == []  # not a /completion, not a /tokenize
    error = refused.value
    assert error.question_id == "route"
    assert error.context_tokens == 2048
    assert error.prompt_bytes >= len(SEVEN_MB.strip())
    assert error.min_tokens > 2048
    assert f"{error.prompt_bytes:,} bytes" in str(error)
    assert "2,048 tokens per request" in str(error)


async def test_examples_past_the_context_are_refused_with_nothing_sent(
    proxied: tuple[FaultInjectingProxy, tv.Session],
) -> None:
    """Each example is shown in every prompt of its question: three of 200 KB each fit no
    prompt, though each alone might."""
    proxy, session = proxied
    example = SEVEN_MB[:200_000]
    question = tv.Choice(
        ["billing", "shipping"],
        instructions="Which team?",
        examples=[(example, "billing"), (example, "shipping"), (example, "billing")],
    )
    before = len(proxy.paths)
    with pytest.raises(tv.PromptTooLongError) as refused:
        await session.judge(TICKET, {"route": question}, timeout=TIMEOUT)
    assert proxy.paths[before:] == []
    assert refused.value.question_id == "route"


async def test_a_choice_past_every_code_is_refused_with_nothing_sent(
    proxied: tuple[FaultInjectingProxy, tv.Session],
) -> None:
    proxy, session = proxied
    wide = tv.Choice([f"team {n}" for n in range(1000)], instructions="Which team?")
    before = len(proxy.paths)
    with pytest.raises(tv.TooManyOptionsError) as refused:
        await session.judge(TICKET, {"route": QUESTION, "team": wide}, timeout=TIMEOUT)
    assert proxy.paths[before:] == []  # it asked the tokenizer about 520 codes first
    error = refused.value
    assert (error.question_id, error.count, error.limit) == ("team", 1000, 520)
    assert "at most 520" in str(error)


async def test_the_gateway_answers_a_state_past_the_context_422_naming_the_question(
    gemma3_url: str,
) -> None:
    async with FaultInjectingProxy(gemma3_url) as proxy:
        session = tv.Session.llama_cpp(proxy.url)
        config = GatewayConfig(keys=(KEY,), request_deadline=TIMEOUT)
        async with running(session, config) as url:
            await wait_until_ready(url)
            before = len(proxy.paths)
            body = {
                "model": "m",
                "state": "I was charged twice.",
                "questions": {
                    "refund": {
                        "type": "noul",
                        "instructions": "Is a refund requested?",
                        "x_examples": [{"state": SEVEN_MB, "answer": True}],
                    }
                },
            }
            async with (
                aiohttp.ClientSession() as client,
                client.post(
                    f"{url}/v1/systemone",
                    data=io.BytesIO(orjson.dumps(body)),  # a 7 MB body, streamed
                    headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
                ) as response,
            ):
                status, reply = response.status, await response.json()
        sent = proxy.paths[before:]
    assert status == 422, reply
    [problem] = reply["detail"]
    assert problem["loc"] == ["body", "questions", "refund"]
    assert "2,048 tokens per request" in problem["msg"]
    assert "bytes of text" in problem["msg"]
    assert "/completion" not in sent, sent
    assert "/tokenize" not in sent, sent
