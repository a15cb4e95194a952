"""The System One gateway given more than it can serve, over the real llama.cpp server (Gemma 3
270M), in this process; the fault proxy (`tests.live.faults`, the named stub) in between makes
the model server slow by delaying each scoring read.

- More requests than can be judged within the deadline: those that would not be judged in
  time get a prompt 429 whose ``Retry-After`` says when to come back, none a 504 (the queue's
  floor of 64 admitted them all, and most met the 504 at the deadline).
- More silent connections than the connection cap: the ones idle longest are closed to make
  room, so health checks and real judgments keep being answered (``/healthz`` answered 503 to
  everyone until the idle timeout closed them), and a request in progress is never cut.

No assertion depends on how fast the machine is: the deadline is fitted to the service time the
gateway measured on this machine just before, and what is compared are statuses, or a 429's
wait against a judgment's.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import attrs
import pytest

import typevet_async as tv
from typevet_async._apps.gateway import GatewayConfig
from typevet_async._apps.gateway.state import GatewayState

from .faults import FaultInjectingProxy
from .helpers import ready_gateway_state

pytestmark = [pytest.mark.live, pytest.mark.asyncio]

KEY = "live-overload-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
QUESTION = {"refund": {"type": "noul", "instructions": "Is a refund requested?"}}
#: Seconds the proxy holds each scoring read: a slow model server, slower than the real
#: read's jitter on a busy machine.
DELAY = 4.0


def body(n: int) -> dict[str, Any]:
    state = f"Ticket {n}: I was charged twice for my order, please refund me."
    return {"model": "m", "state": state, "questions": QUESTION}


@contextlib.asynccontextmanager
async def gateway(upstream: str, **config: Any) -> AsyncIterator[tuple[str, GatewayState]]:
    """The gateway over a session on ``upstream`` (no retries), and its state; ready (probed)
    when the block starts."""
    session = tv.Session.llama_cpp(
        upstream, http=tv.HttpSettings(retry=tv.RetryPolicy(max_retries=0))
    )
    async with ready_gateway_state(session, GatewayConfig(keys=(KEY,), **config)) as served:
        yield served


@attrs.define
class Attempt:
    status: int
    waited: float  # how long the client waited for the answer
    retry_ms: int | None = None


async def attempt(http: aiohttp.ClientSession, url: str, n: int) -> Attempt:
    began = time.perf_counter()
    async with http.post(f"{url}/v1/systemone", json=body(n), headers=AUTH) as response:
        await response.read()
        waited = time.perf_counter() - began
        if response.status != 429:
            return Attempt(response.status, waited)
        seconds, ms = int(response.headers["Retry-After"]), int(response.headers["retry-after-ms"])
        assert seconds == max(1, math.ceil(ms / 1000))
        return Attempt(429, waited, ms)


#: Clients at once: 4 are admitted (see the test), the others shed.
CLIENTS = 8


async def test_requests_the_deadline_cannot_serve_get_a_prompt_429_never_a_504(
    gemma3_url: str,
) -> None:
    async with (
        FaultInjectingProxy(gemma3_url) as proxy,
        gateway(proxy.url, max_active_requests=2) as (url, state),
        aiohttp.ClientSession() as http,
    ):
        proxy.delay = DELAY
        # Measured here, now: both slots busy at once, as they will be under the load.
        for n in range(0, 4, 2):
            warm = await asyncio.gather(attempt(http, url, n), attempt(http, url, n + 1))
            assert [a.status for a in warm] == [200, 200]
        service = state.service_time()
        assert service is not None
        # The deadline fitted to that time: the two running and the next two (judged by 2
        # service times) are in time with half a service time to spare, the next two (3) are
        # not. The queue's floor of 64 admitted them all, and those past 2.5 met the 504.
        deadline = 2.5 * service
        state.config = attrs.evolve(state.config, request_deadline=deadline)

        async def client(n: int) -> list[Attempt]:
            """One request, and if it is shed, once more when it is told to come back."""
            attempts = [await attempt(http, url, 100 + n)]
            told = attempts[0].retry_ms
            if told is not None:
                await asyncio.sleep(told / 1000)
                attempts.append(await attempt(http, url, 100 + n))
            return attempts

        began = time.perf_counter()
        histories = await asyncio.gather(*(client(n) for n in range(CLIENTS)))
        elapsed = time.perf_counter() - began
        times = sorted(round(t, 2) for t in state.service_times)
    attempts = [a for history in histories for a in history]
    statuses = Counter(a.status for a in attempts)
    shed = [a for a in attempts if a.status == 429]
    first = Counter(history[0].status for history in histories)
    returned = Counter(history[1].status for history in histories if len(history) == 2)
    print(
        f"service time {service:.2f} s, deadline {deadline:.2f} s: at first {dict(first)}; "
        f"back when told {dict(returned)}; {elapsed:.1f} s in all; the slowest 429 in "
        f"{max((a.waited for a in shed), default=0):.3f} s; told (ms) "
        f"{[history[0].retry_ms for history in histories]}; service times {times}"
    )
    assert set(statuses) <= {200, 429}, statuses  # never a 504: none admitted out of time
    assert first[200] >= 2  # the slots
    assert first[429] > 0  # 8 at once are more than the deadline serves
    # Each 429 came at once: sooner than a judgment holds its slot.
    assert max(a.waited for a in shed) < service
    # Told when to come back, a client finds a place then (if the judgments ahead of it were
    # no slower than measured; none is ever admitted to meet the 504 instead).
    assert returned[200] > 0


#: Silent connections opened, and the gateway's connection cap they pass.
SILENT = 300
CAP = 64


async def test_silent_connections_past_the_cap_never_lock_clients_out(gemma3_url: str) -> None:
    # While 300 silent connections were open, /healthz answered 503 to every client until the
    # idle timeout (15 s) closed them.
    async with (
        FaultInjectingProxy(gemma3_url) as proxy,
        gateway(proxy.url, max_connections=CAP) as (url, state),
        aiohttp.ClientSession() as http,
    ):
        proxy.delay = DELAY  # a judgment in progress all along
        in_progress = asyncio.create_task(attempt(http, url, 0))
        for _ in range(600):  # bounded: 30 s
            if state.admitted:
                break
            await asyncio.sleep(0.05)
        assert state.admitted
        host, port = url.removeprefix("http://").rsplit(":", 1)
        silent = [await asyncio.open_connection(host, int(port)) for _ in range(SILENT)]
        try:
            async with aiohttp.ClientSession() as other:
                async with other.get(f"{url}/healthz") as health:
                    assert health.status == 200
                judged = await attempt(other, url, 1)
            assert judged.status == 200  # a real judgment, by a new client
            assert (await in_progress).status == 200  # never cut to make room
            # The ones idle longest made room: the first 200 were closed long before their
            # idle timeout, and the newest are still open.
            for reader, _ in silent[:200]:
                assert await asyncio.wait_for(reader.read(), 5) == b""
            assert not any(reader.at_eof() for reader, _ in silent[-CAP // 2 :])
        finally:
            for _, writer in silent:
                writer.close()
