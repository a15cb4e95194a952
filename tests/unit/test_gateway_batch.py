"""``POST /v1/systemone/batch`` over the in-memory stub backend, through aiohttp's test server
(real HTTP on localhost): results in input order, per-item errors, limits, admission,
deadline, metrics and the advertisement in ``GET /v1/models``."""

from __future__ import annotations

import asyncio
import gzip
from typing import Any

import aiohttp
import orjson
import pytest
from typesafe_sdk._schemas import models

import typevet_async as tv
from typevet_async._apps.gateway import STATE, GatewayConfig
from typevet_async._core.wires.system_one import BATCH_PATH

from .stubs import InMemoryStubBackend, sleeping
from .test_gateway import AUTH, assert_error_shape, request_body, serving, start, until

STATES = ["charged twice", {"ticket": 7, "text": "parcel lost"}, ["a", "list", "state"]]


def batch_body(states: list[Any], **fields: Any) -> dict[str, Any]:
    body = request_body(**fields)
    del body["state"]
    body["states"] = states
    return body


@pytest.mark.asyncio
async def test_a_batch_answers_each_state_as_the_single_route_does() -> None:
    # No content-free prior: its reads would count in the first judgment's usage only.
    client, _ = await start(None, tv.SessionSettings(content_free="off"))
    try:
        response = await client.post(BATCH_PATH, json=batch_body(STATES), headers=AUTH)
        assert response.status == 200
        assert response.headers["x-typesafe-request-id"].startswith("req_")
        body = await response.json()
        assert len(body["results"]) == len(STATES)
        for state, result in zip(STATES, body["results"], strict=True):
            single = await client.post(
                "/v1/systemone", json=request_body(state=state), headers=AUTH
            )
            assert result == await single.json()  # the same body, field for field
            models.SystemOneResponse.model_validate(result)
        total = sum(result["usage"]["input_tokens"] for result in body["results"])
        assert body["usage"] == {"input_tokens": total, "output_tokens": 0}
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_a_bad_state_is_its_own_item_error_and_the_rest_are_answered() -> None:
    client, backend = await start()
    try:
        states = ["good one", 42, None, "good two"]
        response = await client.post(BATCH_PATH, json=batch_body(states), headers=AUTH)
        assert response.status == 200
        results = (await response.json())["results"]
        assert "answers" in results[0]
        assert "answers" in results[3]
        for index in (1, 2):
            error = results[index]["error"]
            assert error["status"] == 422
            assert error["loc"] == ["body", "states", index]
            assert "a string, an object or an array" in error["message"]
        assert len(backend.read_requests) == 2 * 3  # the two good states' questions only
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_an_upstream_failure_of_one_state_fails_only_that_item() -> None:
    backend = InMemoryStubBackend()

    async def broken() -> None:
        raise tv.ServerError("boom at http://10.0.0.9", status=500, body="secret")

    backend.state_behaviours["bad state"] = broken
    client, _ = await start(backend)
    try:
        states = ["fine", "bad state", "fine too"]
        response = await client.post(BATCH_PATH, json=batch_body(states), headers=AUTH)
        results = (await response.json())["results"]
        assert [("error" in result) for result in results] == [False, True, False]
        error = results[1]["error"]
        assert (error["status"], error["error_type"]) == (502, "upstream_error")
        assert "10.0.0.9" not in error["message"]
        metrics = await (await client.get("/metrics")).text()
        assert "typevet_gateway_batch_states_total 3.0" in metrics
    finally:
        await client.close()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("body", "loc", "kind"),
    [
        (batch_body([]), ["body", "states"], "missing"),
        (batch_body("not a list"), ["body", "states"], "missing"),  # type: ignore[arg-type]
        (batch_body(["x"] * 5), ["body", "states"], "too_long"),
        (request_body(), ["body", "state"], "extra_forbidden"),
        (batch_body(["x"], questions={}), ["body", "questions"], "missing"),
        (batch_body(["x"], assets={"img": {}}), ["body", "assets"], "unsupported"),
    ],
)
async def test_a_body_that_is_no_batch_is_a_422(body: Any, loc: list[Any], kind: str) -> None:
    client, backend = await start(max_batch_states=4)
    try:
        response = await client.post(BATCH_PATH, json=body, headers=AUTH)
        assert response.status == 422
        detail = (await response.json())["detail"]
        assert_error_shape({"detail": detail}, 422)
        assert (detail[0]["loc"], detail[0]["type"]) == (loc, kind)
        if kind == "too_long":
            assert detail[0]["ctx"] == {"max_length": 4}
        assert backend.read_requests == []
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_hostile_bodies_are_refused_before_anything_is_judged() -> None:
    client, backend = await start(max_body_bytes=64 * 1024, max_depth=16)
    try:
        deep: Any = "x"
        for _ in range(40):
            deep = [deep]
        response = await client.post(BATCH_PATH, json=batch_body([deep]), headers=AUTH)
        assert response.status == 422
        assert (await response.json())["detail"][0]["ctx"] == {"limit": "depth"}
        big = orjson.dumps(batch_body(["y" * 70_000]))
        response = await client.post(BATCH_PATH, data=big, headers=AUTH)
        assert response.status == 413
        bomb = gzip.compress(orjson.dumps(batch_body(["z" * 1_000_000])))
        headers = {**AUTH, "Content-Encoding": "gzip"}
        response = await client.post(BATCH_PATH, data=bomb, headers=headers)
        assert response.status == 413
        assert_error_shape(await response.json(), 413)
        response = await client.post(BATCH_PATH, json=batch_body(["x"]))
        assert response.status == 401
        assert backend.read_requests == []
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_each_state_counts_for_admission() -> None:
    # 2 slots + 2 waiting: a batch of 3 while one request runs would pass them (429), a
    # batch of 3 on an idle gateway is admitted, its states judged 2 at a time.
    backend = InMemoryStubBackend()
    backend.behaviours["refund"] = sleeping(0.3)
    client, _ = await start(backend, max_active_requests=2, max_queue=2)
    try:
        running = asyncio.create_task(
            client.post("/v1/systemone", json=request_body(), headers=AUTH)
        )
        await asyncio.sleep(0.1)
        shed = await client.post(BATCH_PATH, json=batch_body(["a", "b", "c", "d"]), headers=AUTH)
        assert shed.status == 429
        assert "retry-after-ms" in shed.headers
        assert (await running).status == 200
        response = await client.post(BATCH_PATH, json=batch_body(["a", "b", "c"]), headers=AUTH)
        assert response.status == 200
        assert backend.peak <= 2 * 3  # 2 states at once, 3 questions each
        assert client.app[STATE].admitted == 0
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_the_deadline_keeps_the_answers_it_has_and_times_out_the_rest() -> None:
    backend = InMemoryStubBackend()
    backend.state_behaviours["slow"] = sleeping(5.0)
    client, _ = await start(backend, request_deadline=0.5, max_active_requests=2)
    try:
        states = ["quick", "slow", "quick again"]
        response = await client.post(BATCH_PATH, json=batch_body(states), headers=AUTH)
        assert response.status == 200
        results = (await response.json())["results"]
        assert "answers" in results[0]
        assert "answers" in results[2]
        assert (results[1]["error"]["status"], results[1]["error"]["error_type"]) == (
            504,
            "timeout",
        )
        state = client.app[STATE]
        assert state.admitted == 0
        assert not state.slots.locked()
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_models_advertise_the_batch_route_and_its_cap() -> None:
    client, _ = await start(max_batch_states=16)
    try:
        body = await (await client.get("/v1/models", headers=AUTH)).json()
        assert body["x_systemone_batch"] == {"path": BATCH_PATH, "max_states": 16}
        models.ModelMetadataList.model_validate(body)  # the official client still reads it
    finally:
        await client.close()


def test_the_cap_is_bounded_by_what_admission_can_take() -> None:
    assert GatewayConfig().batch_cap() == 64
    assert GatewayConfig(max_active_requests=1, max_queue=0).batch_cap() == 1
    assert GatewayConfig(max_batch_states=1000).batch_cap() == 8 + 64


@pytest.mark.asyncio
async def test_past_the_shutdown_timeout_a_batch_keeps_its_answers_and_the_rest_are_503s() -> None:
    backend = InMemoryStubBackend()
    backend.state_behaviours["slow"] = sleeping(60)
    stop = asyncio.Event()
    task, url = await serving(backend, stop, max_active_requests=2, shutdown_timeout=0.5)
    async with aiohttp.ClientSession() as http:
        body = batch_body(["quick", "slow", "slow"])
        asked = asyncio.create_task(http.post(f"{url}{BATCH_PATH}", json=body, headers=AUTH))
        await until(lambda: backend.in_flight == 2)  # "slow" judged, the other waits
        await asyncio.sleep(0.1)
        stop.set()
        response = await asked
        assert response.status == 200
        assert response.headers["Connection"].lower() == "close"
        results = (await response.json())["results"]
        await asyncio.wait_for(task, 5)
    assert "answers" in results[0]
    for result in results[1:]:
        assert (result["error"]["status"], result["error"]["error_type"]) == (503, "unavailable")
    assert backend.closed == 1
