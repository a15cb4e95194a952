"""Secrets, closing and timed-out generations against the real llama.cpp server (Gemma 3 270M).

What a real server cannot do (echo a key, send a broken header block) is in
tests/unit/test_redaction.py and tests/unit/test_http.py; here the real server's own errors,
real reads cut off by a close, and a real generation that outlives ``request_timeout``.
"""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import pytest

import typevet_async as tv

from .helpers import TICKET, InFlightCounter, questions, shown

pytestmark = [pytest.mark.live, pytest.mark.asyncio]

USER, PASSWORD = "alice-live", "pw-L1ve-s3cret"
#: About 3,000 prompt tokens: more than one slot's 2,048-token context (n_ctx 8,192 over 4
#: slots), which the server refuses with HTTP 400.
TOO_LONG = " ".join(f"sentence {n} about a delayed refund." for n in range(350))


async def test_url_credentials_show_in_no_real_error_or_repr(gemma3_url: str) -> None:
    url = gemma3_url.replace("http://", f"http://{USER}:{PASSWORD}@")
    secrets = [USER, PASSWORD, base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()]
    question = {"refund": tv.Noul(instructions="Is a refund requested?")}
    session = tv.Session.llama_cpp(url, http=tv.HttpSettings(retry=tv.RetryPolicy(max_retries=0)))
    async with session:
        judgment = await session.judge(TICKET, question)  # the credentials go as Basic auth
        with pytest.raises(tv.ServerError) as caught:
            await session.judge(TOO_LONG, question)
    refund = judgment["refund"]
    assert isinstance(refund, tv.NoulAnswer)
    assert 0.0 < refund.noul < 1.0
    assert caught.value.status == 400
    assert "context" in caught.value.body
    text = shown(caught.value) + repr(session) + repr(session.backend)
    assert [secret for secret in secrets if secret in text] == []
    assert "http://***@127.0.0.1" in str(caught.value)
    assert "http://***@127.0.0.1" in repr(session)


async def test_closing_a_session_under_real_reads_fails_each_with_a_state_error(
    gemma3_url: str,
) -> None:
    tasks_before = len(asyncio.all_tasks())
    session = tv.Session.llama_cpp(gemma3_url, max_concurrency=4)
    await session.open()
    await session.probe()

    async def close_soon() -> None:
        await asyncio.sleep(0.3)  # the first reads are being answered (each takes ~100 ms)
        await session.aclose()

    *outcomes, _ = await asyncio.gather(
        *(session.judge(f"{TICKET} (ticket {n})", questions()) for n in range(12)),
        close_soon(),
        return_exceptions=True,
    )
    allowed = tv.Judgment | tv.SessionStateError | asyncio.CancelledError
    assert all(isinstance(outcome, allowed) for outcome in outcomes), outcomes
    assert any(isinstance(outcome, tv.SessionStateError) for outcome in outcomes), outcomes
    await asyncio.sleep(0)
    assert len(asyncio.all_tasks()) == tasks_before


async def test_a_real_generation_that_outlives_request_timeout_is_sent_once(
    gemma3_url: str,
) -> None:
    # At least 3,000 characters (hundreds of tokens) take this model seconds to generate on
    # this 2-core machine: far past the 1 s limit, which the probe's small requests meet.
    chat = InFlightCounter("/v1/chat/completions")
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"story": {"type": "string", "minLength": 3000}},
        "required": ["story"],
        "additionalProperties": False,
    }
    session = tv.Session.llama_cpp(
        gemma3_url,
        http=tv.HttpSettings(
            request_timeout=1.0, retry=tv.RetryPolicy(max_retries=2), trace_configs=[chat.config]
        ),
    )
    async with session:
        await session.probe()
        started = time.monotonic()
        with pytest.raises(tv.RequestTimeoutError) as caught:
            await session.generate("Tell a long story about a refund.", schema=schema)
        elapsed = time.monotonic() - started
    assert chat.started == 1  # not resent: it would start from scratch
    assert elapsed < 2 * 1.0 + 0.5
    assert "the generation outlived request_timeout and was not retried" in str(caught.value)
