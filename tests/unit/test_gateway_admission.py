"""Admission on the System One gateway (issue 43, items 3 and 9): the queue and a 429's wait
come from the service times of the judgments that did the work, over the in-memory stub
backend through aiohttp's test server.

Time is a fake clock the test moves (`FakeClock`, put in place of the gateway modules'
``time``): a stubbed read "takes" 0.15 s by moving it, an idle hour passes in one line, and
the event loop keeps its own clock. No assertion depends on how fast this machine runs.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import anyio
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

import typevet_async as tv
from typevet_async._core.systemone import BATCH_PATH
from typevet_async._gateway import MIN_AUTO_QUEUE, STATE, GatewayConfig
from typevet_async._gateway import app as gateway_app
from typevet_async._gateway import batch as gateway_batch
from typevet_async._gateway import state as gateway_state

from .stubs import Behaviour, InMemoryStubBackend
from .test_gateway import AUTH, request_body, start, until

Client = TestClient[web.Request, web.Application]


class FakeClock:
    """The gateway's monotonic clock, moved only by the test (``perf_counter``, which the
    access log times requests with, stays the real one)."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def monotonic(self) -> float:
        return self.now

    @staticmethod
    def perf_counter() -> float:
        return time.perf_counter()

    def taking(self, seconds: float) -> Behaviour:
        """A read that takes ``seconds`` of this clock."""

        async def behaviour() -> None:
            self.now += seconds

        return behaviour

    def failing(self, seconds: float, error: Exception) -> Behaviour:
        """A read that fails with ``error`` after ``seconds`` of this clock."""

        async def behaviour() -> None:
            self.now += seconds
            raise error

        return behaviour

    def hanging(self, seconds: float) -> Behaviour:
        """A read that takes ``seconds`` of this clock and then never ends."""

        async def behaviour() -> None:
            self.now += seconds
            await anyio.sleep_forever()

        return behaviour


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    # Wherever the gateway reads the time (the state; app and batch stamped it before).
    for module in (gateway_state, gateway_app, gateway_batch):
        monkeypatch.setattr(module, "time", fake, raising=False)
    return fake


def waiting(release: asyncio.Event) -> Behaviour:
    async def behaviour() -> None:
        await release.wait()

    return behaviour


ONE_QUESTION = {"refund": {"type": "noul", "instructions": "Is a refund requested?"}}


async def post(client: Client, **fields: Any) -> Any:
    body = request_body(questions=ONE_QUESTION, **fields)
    return await client.post("/v1/systemone", json=body, headers=AUTH)


async def answered(client: Client, times: int) -> None:
    for _ in range(times):  # one after another: each holds its slot alone
        assert (await post(client)).status == 200


def retry_headers(response: Any) -> tuple[str, str]:
    assert response.status == 429
    return response.headers["Retry-After"], response.headers["retry-after-ms"]


@pytest.mark.asyncio
async def test_fast_upstream_refusals_do_not_grow_the_queue(clock: FakeClock) -> None:
    # 64 fast upstream refusals pushed the measured drain rate to hundreds a second and the
    # queue to its 4,096 cap, while real judgments drained at a few a second: the requests far
    # back were admitted only to get a 504 at the deadline.
    backend = InMemoryStubBackend()
    client, _ = await start(backend, max_active_requests=2, request_deadline=60.0)
    state = client.app[STATE]
    try:
        backend.behaviours["refund"] = clock.taking(0.5)
        await answered(client, 4)
        before = state.queue_limit()
        down = tv.ServerError("HTTP 500: the model server is down", status=500, body="down")
        backend.behaviours["refund"] = clock.failing(0.001, down)
        for _ in range(64):
            assert (await post(client)).status == 502
        assert state.queue_limit() == before  # before the fix: 4,096
        # Little's law on the judgments that did the work: 2 slots / 0.5 s = 4 a second; the
        # last in line gets its slot after 59.5 s and is judged by the 60 s deadline.
        assert before == math.floor(4 * (60 - 0.5)) == 238
        # One more than the slots and the queue: a prompt 429, told one departure (1/4 s).
        state.admitted = 2 + before
        assert retry_headers(await post(client)) == ("1", "250")
        state.admitted = 0
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_retry_after_comes_from_service_times_not_idle_time(clock: FakeClock) -> None:
    # After an idle hour, a busy slot that frees in 0.15 s was a Retry-After of 58 to 60.
    backend = InMemoryStubBackend()
    client, _ = await start(backend, max_active_requests=1, max_queue=0)
    state = client.app[STATE]
    release = asyncio.Event()
    try:
        backend.behaviours["refund"] = clock.taking(0.15)
        await answered(client, 3)
        clock.now += 3600  # an idle hour
        backend.behaviours["refund"] = waiting(release)
        busy = asyncio.create_task(post(client))
        await until(lambda: state.admitted == 1)
        # Whole seconds (rounded up, at least 1) and the estimate itself in ms: not 1,000.
        assert retry_headers(await post(client)) == ("1", "150")
        release.set()
        assert (await busy).status == 200
    finally:
        release.set()
        await client.close()


@pytest.mark.asyncio
async def test_requests_shed_together_are_told_to_come_back_one_departure_apart(
    clock: FakeClock,
) -> None:
    backend = InMemoryStubBackend()
    client, _ = await start(backend, max_active_requests=1, max_queue=0)
    state = client.app[STATE]
    release = asyncio.Event()
    try:
        backend.behaviours["refund"] = clock.taking(0.4)
        await answered(client, 2)
        backend.behaviours["refund"] = waiting(release)
        busy = asyncio.create_task(post(client))
        await until(lambda: state.admitted == 1)
        # Each 429 promises the next departure: told all alike, they would all come back
        # together into one free place.
        told = [retry_headers(await post(client)) for _ in range(3)]
        assert told == [("1", "400"), ("1", "800"), ("2", "1200")]
        clock.now += 5  # the promised places have come and gone
        assert retry_headers(await post(client)) == ("1", "400")
        release.set()
        assert (await busy).status == 200
    finally:
        release.set()
        await client.close()


@pytest.mark.asyncio
async def test_a_batch_shed_is_told_the_departures_all_its_states_need(clock: FakeClock) -> None:
    backend = InMemoryStubBackend()
    client, _ = await start(backend, max_active_requests=1, max_queue=2)
    state = client.app[STATE]
    try:
        backend.behaviours["refund"] = clock.taking(0.4)
        await answered(client, 2)
        state.admitted = 3  # as if the slot and the queue were taken
        batch = {**request_body(questions=ONE_QUESTION), "states": ["a", "b", "c"]}
        del batch["state"]
        shed = await client.post(BATCH_PATH, json=batch, headers=AUTH)
        assert retry_headers(shed) == ("2", "1200")  # 3 departures of 0.4 s
        assert retry_headers(await post(client)) == ("2", "1600")  # then one more
        state.admitted = 0
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_the_floor_and_ceiling_of_the_advised_wait(clock: FakeClock) -> None:
    backend = InMemoryStubBackend()
    client, _ = await start(backend, max_active_requests=1, max_queue=0)
    state = client.app[STATE]
    release = asyncio.Event()
    try:
        backend.behaviours["refund"] = waiting(release)
        busy = asyncio.create_task(post(client))
        await until(lambda: state.admitted == 1)
        assert retry_headers(await post(client)) == ("1", "1000")  # nothing measured yet
        release.set()
        assert (await busy).status == 200
        release.clear()
        # 1 ms judgments: one departure is 1 ms; advised 50 ms, the floor.
        state.service_times.clear()
        state.service_times.extend([0.001] * 4)
        busy = asyncio.create_task(post(client))
        await until(lambda: state.admitted == 1)
        assert retry_headers(await post(client)) == ("1", "50")
        # 100 s judgments: advised 60 s, the ceiling.
        state.service_times.clear()
        state.service_times.extend([100.0] * 4)
        state.promised_until = 0.0
        assert retry_headers(await post(client)) == ("60", "60000")
        release.set()
        assert (await busy).status == 200
    finally:
        release.set()
        await client.close()


@pytest.mark.asyncio
async def test_a_judgment_cut_by_the_deadline_counts_its_whole_slot_time(clock: FakeClock) -> None:
    backend = InMemoryStubBackend()
    # No Score prior: its reads would run before the hanging one, inside the same deadline.
    off = tv.SessionSettings(content_free="off")
    client, _ = await start(backend, off, max_active_requests=1, request_deadline=0.3)
    state = client.app[STATE]
    try:
        # It holds its slot 5 s (of the fake clock) and is then cut by the (real) deadline; the
        # one behind it is cut while it waits for the slot, which it never held.
        backend.behaviours["refund"] = clock.hanging(5.0)
        first, second = await asyncio.gather(post(client), post(client))
        assert (first.status, second.status) == (504, 504)
        assert list(state.service_times) == [5.0]
        # and a fast failure is no measure at all
        down = tv.ServerError("HTTP 503: busy", status=503, body="")
        backend.behaviours["refund"] = clock.failing(0.001, down)
        assert (await post(client)).status == 502
        assert list(state.service_times) == [5.0]
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_a_batch_measures_its_answered_states_and_not_its_failed_ones(
    clock: FakeClock,
) -> None:
    backend = InMemoryStubBackend()
    client, _ = await start(backend, max_active_requests=1)
    state = client.app[STATE]
    try:
        backend.state_behaviours["slow"] = clock.taking(0.5)
        down = tv.ServerError("HTTP 500: down", status=500, body="")
        backend.state_behaviours["refused"] = clock.failing(0.001, down)
        batch = {**request_body(questions=ONE_QUESTION), "states": ["slow", "refused", "slow"]}
        del batch["state"]
        response = await client.post(BATCH_PATH, json=batch, headers=AUTH)
        results = (await response.json())["results"]
        assert [("error" in result) for result in results] == [False, True, False]
        assert list(state.service_times) == [0.5, 0.5]
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_a_batch_cut_by_the_deadline_counts_the_states_holding_slots(
    clock: FakeClock,
) -> None:
    backend = InMemoryStubBackend()
    client, _ = await start(backend, max_active_requests=2, request_deadline=0.3)
    state = client.app[STATE]
    try:
        backend.behaviours["refund"] = clock.hanging(2.0)
        batch = {**request_body(questions=ONE_QUESTION), "states": ["a", "b", "c"]}
        del batch["state"]
        response = await client.post(BATCH_PATH, json=batch, headers=AUTH)
        results = (await response.json())["results"]
        assert [result["error"]["status"] for result in results] == [504, 504, 504]
        # two states held the two slots (each while the other's 2 s passed too: 4 s of the
        # fake clock by the cut); the third never got one
        assert list(state.service_times) == [4.0, 4.0]
    finally:
        await client.close()


def test_a_client_pool_is_never_shed_however_slow_the_judgments() -> None:
    # A queue below a common client pool (8 + 16) shed 15 of 200 requests of the official
    # client at concurrency 32; the queue's floor holds a pool of 64 even when the measured
    # capacity would queue fewer within the deadline.
    state = gateway_state.GatewayState(
        GatewayConfig(), asyncio.Semaphore(8), anyio.CapacityLimiter(1), None
    )
    state.service_times.extend([30.0] * 8)  # 8 slots / 30 s: 8 fit in the 60 s deadline
    assert state.queue_limit() == MIN_AUTO_QUEUE
    state.service_times.extend([1.6] * 64)  # 8 / 1.6 s = 5 a second
    assert state.queue_limit() == math.floor(5 * (60 - 1.6)) == 292
    state.service_times.extend([0.001] * 64)
    assert state.queue_limit() == 4096  # the ceiling
