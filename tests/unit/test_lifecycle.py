"""Closing while requests are in flight: every caller gets a `SessionStateError` (or its own
cancellation), never a raw error from a pool that was closed under it.

Against the fault-injecting stub server (named as such), which answers late on cue; a real
llama.cpp server answers a read in milliseconds, too fast to close it reliably mid-read.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

import typevet_async as tv
from typevet_async._backends.http import HttpClient

from .stubs import IDS, FaultInjectingStubServer, noul, reply, stopwatch

pytestmark = pytest.mark.asyncio

PROBE = tv.Probe(tv.TemplateFamily.GEMMA3, "rendered", IDS, 262_144)
COMPLETION = (
    b'{"completion_probabilities": [{"top_logprobs": [{"id": 1000, "logprob": -1.0}, '
    b'{"id": 1001, "logprob": -2.0}]}], "generation_settings": {"n_probs": 2}, '
    b'"tokens_evaluated": 7}'
)


@pytest_asyncio.fixture
async def slow() -> AsyncIterator[FaultInjectingStubServer]:
    """Answers each request 2 s after it arrives: far later than any test here closes."""
    server = FaultInjectingStubServer(lambda c, n: reply(200, COMPLETION), delay=2.0)
    await server.start()
    yield server
    await server.stop()


class ProbedLlamaCpp(tv.AsyncLlamaCpp):
    async def probe(self) -> tv.Probe:
        return PROBE


def allowed(outcome: Any) -> bool:
    """What an in-flight caller may get once the client closed."""
    return isinstance(outcome, tv.SessionStateError | asyncio.CancelledError)


async def close_soon(close: Any, delay: float = 0.1) -> None:
    await asyncio.sleep(delay)
    await close()


async def test_closing_the_client_under_concurrent_requests_fails_each_with_a_state_error(
    slow: FaultInjectingStubServer,
) -> None:
    # 12 requests on 4 connections: 4 in flight (and their stale-connection replay, once the
    # pool closes them), 8 waiting for a connection slot, all when the client closes.
    client = HttpClient(slow.url, tv.HttpSettings(max_connections=4))
    await client.open()
    with stopwatch() as watch:
        outcomes = await asyncio.gather(
            *(client.post("/completion", {}) for _ in range(12)),
            close_soon(client.aclose),
            return_exceptions=True,
        )
    assert outcomes[-1] is None  # aclose itself
    errors = outcomes[:-1]
    assert all(allowed(outcome) for outcome in errors), errors
    assert all("closed" in str(outcome) for outcome in errors)
    assert watch.elapsed < 1.0  # none waited for its reply (2 s), or retried
    assert len(slow.requests) == 4  # nothing was sent after the close


async def test_a_request_waiting_to_retry_when_the_client_closes_gets_a_state_error(
    slow: FaultInjectingStubServer,
) -> None:
    slow.delay = 0.0
    slow.handler = lambda c, n: reply(503, b"{}", "Retry-After: 1\r\n")
    client = HttpClient(slow.url, tv.HttpSettings(retry=tv.RetryPolicy(max_retries=2)))
    await client.open()
    with stopwatch() as watch:
        outcome, _ = await asyncio.gather(
            client.post("/completion", {}), close_soon(client.aclose, 0.2), return_exceptions=True
        )
    assert isinstance(outcome, tv.SessionStateError), repr(outcome)
    assert len(slow.requests) == 1  # the retry found the client closed, and sent nothing
    assert watch.elapsed < 0.6  # the 1 s Retry-After wait ended at the close


async def test_closing_a_session_under_concurrent_judgments_and_a_batch(
    slow: FaultInjectingStubServer,
) -> None:
    config = tv.LlamaCppConfig(base_url=slow.url, top_k=2)
    session = tv.Session(ProbedLlamaCpp(config), tv.SessionSettings(max_concurrency=8))
    await session.open()
    questions = {f"q{n}": noul(n) for n in range(3)}

    async def batch() -> list[Any]:
        items = []
        try:
            async for item in session.judge_many(["a", "b", "c", "d"], {"q": noul()}):
                items.append(item.error)
        except tv.SessionStateError as error:  # raised once, as a batch-wide error
            items.append(error)
        return items

    *judged, batched, _ = await asyncio.gather(
        *(session.judge(f"state {n}", questions) for n in range(6)),
        batch(),
        close_soon(session.aclose),
        return_exceptions=True,
    )
    assert all(allowed(outcome) for outcome in judged), judged
    assert isinstance(batched, list), repr(batched)
    assert batched, "the batch yielded nothing"
    assert all(allowed(outcome) for outcome in batched), batched
    with pytest.raises(tv.SessionStateError, match="closed"):
        await session.judge("after", questions)
