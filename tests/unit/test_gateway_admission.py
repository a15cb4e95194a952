"""Admission on the System One gateway: which requests are admitted and a 429's wait come
from the service times of the judgments that did the work, over the in-memory stub backend
through aiohttp's test server. A request that would not be judged within its deadline behind
those admitted is shed at once, whatever the queue's floor.

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
from typevet_async._apps.gateway import DEFAULT_AUTO_QUEUE, STATE, GatewayConfig
from typevet_async._apps.gateway import app as gateway_app
from typevet_async._apps.gateway import batch as gateway_batch
from typevet_async._apps.gateway import state as gateway_state
from typevet_async._apps.gateway.responses import shed_response
from typevet_async._core.wires.system_one import BATCH_PATH

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


def behind_busy_slots(state: gateway_state.GatewayState) -> int:
    """The places open behind every slot just taken (and nobody waiting): the queue that the
    measured service times fit within the deadline."""
    holding, admitted = list(state.holding), state.admitted
    slots = state.config.max_active_requests
    state.holding[:] = [state.now()] * slots
    state.admitted = slots
    try:
        return state.places()
    finally:
        state.holding[:], state.admitted = holding, admitted


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
        before = behind_busy_slots(state)
        down = tv.ServerError("HTTP 500: the model server is down", status=500, body="down")
        backend.behaviours["refund"] = clock.failing(0.001, down)
        for _ in range(64):
            assert (await post(client)).status == 502
        assert behind_busy_slots(state) == before  # before the fix: 4,096
        # 2 slots of 0.5 s judgments, both just taken: each frees every 0.5 s, and a request
        # whose slot frees by 59.375 s from now is judged by the 60 s deadline with a quarter
        # of a judgment to spare: 118 each.
        assert before == 2 * math.floor((60 - 0.5 * 1.25) / 0.5) == 236
        # One more: a prompt 429, told when its slot (at 59.5 s) would be early enough: 0.125 s.
        state.holding[:] = [clock.now] * 2
        state.admitted = 2 + before
        assert retry_headers(await post(client)) == ("1", "125")
        state.holding.clear()
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
        state.promises.clear()
        state.promised = 0
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
        # It holds its slot 5 s (of the fake clock) and is then cut by the (real) deadline.
        backend.behaviours["refund"] = clock.hanging(5.0)
        assert (await post(client)).status == 504
        assert list(state.service_times) == [5.0]
        assert state.holding == []
        # One cut while it waits for the slot (held here by the test, so nothing else can
        # take it first) never held it: it counts nothing.
        await state.slots.acquire()
        try:
            assert (await post(client)).status == 504
        finally:
            state.slots.release()
        assert list(state.service_times) == [5.0]
        # and a fast failure is no measure at all
        down = tv.ServerError("HTTP 503: busy", status=503, body="")
        backend.behaviours["refund"] = clock.failing(0.001, down)
        assert (await post(client)).status == 502
        assert list(state.service_times) == [5.0]
        assert state.holding == []
        assert state.admitted == 0
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


@pytest.mark.asyncio
async def test_a_request_that_cannot_be_judged_in_time_is_shed_at_once_and_told_when(
    clock: FakeClock,
) -> None:
    # 16 clients on a model server slow enough that 8 slots were held about 56 s a judgment:
    # the queue's floor of 64 admitted every request, and 46 of 86 met the 504 at 60 s.
    backend = InMemoryStubBackend()
    client, _ = await start(backend, max_active_requests=2, request_deadline=10.0)
    state = client.app[STATE]
    release = asyncio.Event()
    try:
        backend.behaviours["refund"] = clock.taking(4.0)
        await answered(client, 2)  # each holds a slot 4 s
        assert list(state.service_times) == [4.0, 4.0]
        backend.behaviours["refund"] = waiting(release)
        busy = [asyncio.create_task(post(client)) for _ in range(2)]
        await until(lambda: state.admitted == 2)
        # Both slots free in 4 s: the next two are judged by 8 s, within the 10 s deadline
        # with a quarter of a judgment (1 s) to spare.
        queued = [asyncio.create_task(post(client)) for _ in range(2)]
        await until(lambda: state.admitted == 4)
        # The next would get a slot at 8 s and end at 12 s: shed now, not cut at 10 s, and
        # told to come back when it would end in time with its spare: at 3 s (the queue's
        # floor of 64 admitted it).
        assert retry_headers(await post(client)) == ("3", "3000")
        # Told so, it comes back: its slot frees at 8 s, and it ends at 12 s, 1 s before its
        # deadline.
        clock.now += 3.0
        assert shed_response(state, 1) is None
        release.set()
        statuses = [(await task).status for task in [*busy, *queued]]
        assert statuses == [200, 200, 200, 200]
    finally:
        release.set()
        await client.close()


@pytest.mark.asyncio
async def test_requests_shed_by_the_deadline_are_told_their_own_times(clock: FakeClock) -> None:
    backend = InMemoryStubBackend()
    client, _ = await start(backend, max_active_requests=2, request_deadline=10.0)
    state = client.app[STATE]
    try:
        backend.behaviours["refund"] = clock.taking(4.0)
        await answered(client, 1)
        state.holding[:] = [clock.now, clock.now - 1.0]  # both slots held, one for 1 s
        state.admitted = 4  # and two waiting
        # Slots free at 3 and 4 s; the two waiting take them and free them at 7 and 8 s; the
        # next three would get slots at 7, 8 and 11 s. Each is told when its slot would be
        # early enough to end by its deadline with 1 s to spare: 2 s, then 3 s, then 6 s.
        told = [retry_headers(await post(client)) for _ in range(3)]
        assert told == [("2", "2000"), ("3", "3000"), ("6", "6000")]
        state.holding.clear()
        state.admitted = 0
    finally:
        await client.close()


def test_the_queue_floor_only_holds_while_nothing_is_measured(clock: FakeClock) -> None:
    state = gateway_state.GatewayState(
        GatewayConfig(), asyncio.Semaphore(8), anyio.CapacityLimiter(1), None
    )
    state.admitted = 8
    state.holding[:] = [clock.now] * 8
    assert state.places() == DEFAULT_AUTO_QUEUE  # nothing measured: the default queue
    # 8 slots held 24 s a judgment: one round behind the 8 running fits the 60 s deadline with
    # its spare (it was 64, the floor: a client pool of 64 was never shed, however late it was
    # judged).
    state.service_times.extend([24.0] * 8)
    assert state.places() == 8
    state.admitted = 16
    assert state.places() == 0
    # 1.6 s judgments: 36 rounds of 8 behind those running (it was 292, Little's law)
    state.service_times.clear()
    state.service_times.extend([1.6] * 64)
    assert state.places() == 8 * math.floor((60 - 1.6 * 1.25 - 1.6) / 1.6 + 1) - 8 == 280
    state.service_times.extend([0.001] * 64)
    assert state.places() == 8 + 4096 - 16  # the ceiling


def test_a_free_slot_or_an_idle_gateway_always_admits(clock: FakeClock) -> None:
    # Judgments longer than the deadline: none would be in time, yet refusing them all would
    # leave the measure as it is for ever. A free slot is taken, an idle gateway admits.
    state = gateway_state.GatewayState(
        GatewayConfig(), asyncio.Semaphore(8), anyio.CapacityLimiter(1), None
    )
    state.service_times.extend([100.0] * 8)
    assert state.places() == 8 + 4096  # idle: a batch of any size within the cap
    state.admitted = 7
    state.holding[:] = [clock.now] * 7
    assert state.places() == 1
    state.admitted = 8
    state.holding.append(clock.now)
    assert state.places() == 0
