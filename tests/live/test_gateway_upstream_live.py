"""The System One gateway over a failing upstream (issue 43, items 3, 5 and 9): the fault
proxy (`tests.live.faults`, the named stub) between the gateway's session and the real
llama.cpp server (Gemma 3 270M), in this process.

- Admission is sized from the judgments that did the work: the real server's answered reads;
  64 fast upstream refusals leave it where it was (they pushed the queue to its 4,096 cap).
- A 429's wait comes from those service times, not from the time since the last judgment:
  after an idle hour (the gateway's clock moved, not the event loop's) it is still the time a
  real judgment holds its slot.
- The gateway's log names an upstream failure by type and status; the upstream's reply, which
  quotes the customer's prompt here, stays out of it.

No assertion depends on how fast the machine is: what is compared is the gateway's own state
before and after, or a bound that holds at any speed (a judgment holds its slot for less than
the time its client waits for it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

import typevet_async as tv
from typevet_async._apps.gateway import GatewayConfig
from typevet_async._apps.gateway import state as gateway_state
from typevet_async._apps.gateway.state import RETRY_FLOOR, GatewayState

from .faults import FaultInjectingProxy
from .helpers import ready_gateway_state

pytestmark = [pytest.mark.live, pytest.mark.asyncio]

KEY = "live-upstream-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
#: The customer's text: the quoting upstream sends it back in its error reply.
SECRET = "PRIVATE-TICKET-7c21"
QUESTION = {"refund": {"type": "noul", "instructions": "Is a refund requested?"}}


def body(n: int = 0) -> dict[str, Any]:
    state = f"{SECRET}: I was charged twice for order {n}, please refund me."
    return {"model": "m", "state": state, "questions": QUESTION}


@contextlib.asynccontextmanager
async def gateway(
    upstream: str, **config: Any
) -> AsyncIterator[tuple[str, GatewayState, aiohttp.ClientSession]]:
    """The gateway over a session on ``upstream`` (no retries: one refusal is one failure), its
    state, and a client; ready (probed) when the block starts."""
    session = tv.Session.llama_cpp(
        upstream, http=tv.HttpSettings(retry=tv.RetryPolicy(max_retries=0))
    )
    async with (
        ready_gateway_state(session, GatewayConfig(keys=(KEY,), **config)) as (url, state),
        aiohttp.ClientSession() as http,
    ):
        yield url, state, http


async def judged(http: aiohttp.ClientSession, url: str, n: int = 0) -> tuple[int, float]:
    """One request's status and how long its client waited for it."""
    began = time.perf_counter()
    async with http.post(f"{url}/v1/systemone", json=body(n), headers=AUTH) as response:
        await response.read()
        return response.status, time.perf_counter() - began


async def test_fast_upstream_refusals_leave_the_queue_where_real_work_put_it(
    gemma3_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="typevet_async")
    async with (
        FaultInjectingProxy(gemma3_url) as proxy,
        gateway(proxy.url, max_active_requests=2) as (url, state, http),
    ):
        for n in range(4):  # real judgments, one after another
            assert (await judged(http, url, n))[0] == 200
        service = state.service_time()
        assert service is not None
        # the judgments admitted within the 60 s deadline, given slots from now
        before = state.timely(service, 60.0)
        proxy.script = ["http_500_quoting"] * 64
        for n in range(64):
            assert (await judged(http, url, 100 + n))[0] == 502
        after = state.timely(service, 60.0)
        print(f"places in time after 4 real judgments {before}, after 64 refusals {after}")
        assert proxy.script == []  # each refusal was one scoring read's
        assert len(state.service_times) == 4  # the refusals measured nothing
        assert state.service_time() == service
        assert after == before  # before the fix: the 4,096 cap
    # Item 5: each refusal is logged by its type and status; the quoted prompt is not.
    failed = [r for r in caplog.records if r.getMessage().startswith("judgment failed")]
    assert len(failed) == 64
    assert {r.getMessage() for r in failed} == {"judgment failed: ServerError (HTTP 500)"}
    assert SECRET not in caplog.text


class OffsetClock:
    """The gateway's monotonic clock, ``offset`` seconds ahead of the real one."""

    def __init__(self) -> None:
        self.offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset


async def test_retry_after_after_an_idle_hour_is_a_judgments_time(
    gemma3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A busy slot that frees in 0.15 s got Retry-After: 58 after an idle hour.
    clock = OffsetClock()
    monkeypatch.setattr(gateway_state, "time", clock)
    async with (
        FaultInjectingProxy(gemma3_url) as proxy,
        gateway(proxy.url, max_active_requests=1, max_queue=0) as (url, state, http),
    ):
        waits = []
        for n in range(3):
            status, waited = await judged(http, url, n)
            assert status == 200
            waits.append(waited)
        clock.offset += 3600  # an idle hour, for the gateway
        proxy.script = ["hang"]  # the next judgment holds the one slot
        busy = asyncio.create_task(judged(http, url, 99))
        for _ in range(600):
            if state.admitted == 1:
                break
            await asyncio.sleep(0.05)
        assert state.admitted == 1
        async with http.post(f"{url}/v1/systemone", json=body(7), headers=AUTH) as shed:
            assert shed.status == 429
            seconds, ms = int(shed.headers["Retry-After"]), int(shed.headers["retry-after-ms"])
        busy.cancel()  # the client goes away: its judgment (and the hung read) is cancelled
        with contextlib.suppress(asyncio.CancelledError):
            await busy
        await asyncio.wait_for(proxy.client_hung_up.wait(), 30)
    print(f"after an idle hour: Retry-After {seconds}, retry-after-ms {ms}; waits {waits}")
    # A judgment holds its slot for less than its client waits for it: the wait a 429 tells
    # is one such time (before the fix: 60,000 ms, the ceiling, from the idle hour).
    assert ms <= max(RETRY_FLOOR * 1000, 1000 * max(waits))
    assert seconds == max(1, math.ceil(ms / 1000))
