"""The System One gateway (`typevet_async._gateway`) over the in-memory stub backend, through
aiohttp's own test server and client (real HTTP on localhost)."""

from __future__ import annotations

import asyncio
import gzip
import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from backports import zstd
from typesafe_sdk._schemas import models

import typevet_async as tv
from typevet_async._gateway import (
    BodyTooLargeError,
    GatewayConfig,
    build_app,
    decompress,
    load_keys,
    runner_options,
)

from .stubs import InMemoryStubBackend, sleeping

KEY = "s3cret-key-0123456789"
STATE_TEXT = "PRIVATE-STATE-TEXT charged twice"


def request_body(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "gemma-3-270m",
        "state": STATE_TEXT,
        "questions": {
            "refund": {"type": "noul", "instructions": "Is a refund requested?"},
            "route": {
                "type": "choice",
                "instructions": "Team?",
                "criteria": {"billing": "money", "shipping": None},
            },
            "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["a", "b"]},
        },
    }
    body.update(fields)
    return body


async def open_client(
    app: web.Application, config: GatewayConfig
) -> TestClient[web.Request, web.Application]:
    server = TestServer(app)
    # The runner's options go to start_server (TestServer's own keywords are not passed on).
    await server.start_server(**runner_options(config))
    client = TestClient(server)
    await client.start_server()
    return client


async def start(
    backend: InMemoryStubBackend | None = None, **config: Any
) -> tuple[TestClient[web.Request, web.Application], InMemoryStubBackend]:
    backend = backend or InMemoryStubBackend()
    gateway = GatewayConfig(**{"keys": (KEY,), "probe_interval": 0.01, **config})
    app = build_app(tv.Session(backend), gateway)
    client = await open_client(app, gateway)
    for _ in range(200):  # the probe runs in the background after startup
        if (await client.get("/readyz")).status == 200:
            break
        await asyncio.sleep(0.01)
    return client, backend


@pytest_asyncio.fixture
async def client() -> AsyncIterator[TestClient[web.Request, web.Application]]:
    client, _ = await start()
    yield client
    await client.close()


AUTH = {"Authorization": f"Bearer {KEY}"}


def assert_error_shape(body: Any) -> None:
    models.HTTPValidationError.model_validate(body)
    assert body["detail"]
    assert set(body["detail"][0]) >= {"loc", "msg", "type", "input"}


@pytest.mark.asyncio
async def test_a_request_gets_a_system_one_response(
    client: TestClient[web.Request, web.Application],
) -> None:
    response = await client.post("/v1/systemone", json=request_body(), headers=AUTH)
    assert response.status == 200
    body = await response.json()
    models.SystemOneResponse.model_validate(body)
    assert body["model"] == "stub-model"
    assert list(body["answers"]) == ["refund", "route", "urgency"]
    assert body["answers"]["urgency"]["legend"] == {"0": "a", "1": "b"}
    assert "typevet" in body


@pytest.mark.asyncio
@pytest.mark.parametrize("header", [None, "Bearer wrong", "Basic " + KEY, "Bearer "])
async def test_a_missing_or_wrong_key_is_a_401_in_the_system_one_shape(
    client: TestClient[web.Request, web.Application], header: str | None
) -> None:
    headers = {} if header is None else {"Authorization": header}
    for method, path in (("POST", "/v1/systemone"), ("GET", "/v1/models")):
        response = await client.request(method, path, json=request_body(), headers=headers)
        assert response.status == 401
        body = await response.json()
        assert_error_shape(body)
        assert body["detail"][0]["loc"] == ["header", "authorization"]
        assert body["detail"][0]["type"] == "unauthorized"
        assert body["detail"][0]["input"] is None


@pytest.mark.asyncio
async def test_no_keys_is_auth_off() -> None:
    client, _ = await start(keys=())
    try:
        response = await client.post("/v1/systemone", json=request_body())
        assert response.status == 200
    finally:
        await client.close()


def test_keys_come_from_a_file_and_a_variable(tmp_path: Any) -> None:
    path = tmp_path / "keys"
    path.write_text("# ops\nalpha\n\n beta \n")
    assert load_keys(path, "KEYS", {"KEYS": "gamma, alpha,"}) == ("alpha", "beta", "gamma")
    assert load_keys(None, "KEYS", {}) == ()


@pytest.mark.asyncio
async def test_bad_questions_are_a_422_with_the_validation_detail(
    client: TestClient[web.Request, web.Application],
) -> None:
    body = request_body(questions={"q": {"type": "box"}, "r": {"type": "score", "criteria": 3}})
    response = await client.post("/v1/systemone", json=body, headers=AUTH)
    assert response.status == 422
    detail = await response.json()
    assert_error_shape(detail)
    assert [entry["loc"] for entry in detail["detail"]] == [
        ["body", "questions", "q"],
        ["body", "questions", "r"],
    ]
    for raw in (b"{not json", b"[1, 2]"):
        response = await client.post("/v1/systemone", data=raw, headers=AUTH)
        assert response.status == 422
        assert_error_shape(await response.json())


@pytest.mark.asyncio
async def test_a_body_past_the_limit_is_a_413(
    client: TestClient[web.Request, web.Application],
) -> None:
    small, _ = await start(max_body_bytes=1000)
    try:
        big = request_body(state="x" * 2000)
        response = await small.post("/v1/systemone", json=big, headers=AUTH)
        assert response.status == 413
        assert_error_shape(await response.json())
        # Compressed below the limit, but it inflates past it: still a 413.
        packed = gzip.compress(orjson.dumps(big))
        assert len(packed) < 1000
        headers = {**AUTH, "Content-Encoding": "gzip"}
        response = await small.post("/v1/systemone", data=packed, headers=headers)
        assert response.status == 413
    finally:
        await small.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("encoding", ["zstd", "gzip", "identity"])
async def test_compressed_bodies_are_read(
    client: TestClient[web.Request, web.Application], encoding: str
) -> None:
    raw = orjson.dumps(request_body())
    data = {"zstd": zstd.compress, "gzip": gzip.compress, "identity": bytes}[encoding](raw)
    headers = {**AUTH, "Content-Encoding": encoding, "Content-Type": "application/json"}
    response = await client.post("/v1/systemone", data=data, headers=headers)
    assert response.status == 200
    models.SystemOneResponse.model_validate(await response.json())


@pytest.mark.asyncio
async def test_an_unknown_encoding_or_a_corrupt_body_is_refused(
    client: TestClient[web.Request, web.Application],
) -> None:
    for encoding, data in (("br", b"x"), ("zstd", b"not zstd"), ("gzip", b"not gzip")):
        headers = {**AUTH, "Content-Encoding": encoding}
        response = await client.post("/v1/systemone", data=data, headers=headers)
        assert response.status == 415
        assert_error_shape(await response.json())


def test_a_zip_bomb_stops_at_the_cap() -> None:
    bomb = zstd.compress(b"\0" * (64 * 1024 * 1024))
    assert len(bomb) < 10_000
    with pytest.raises(BodyTooLargeError):
        decompress(bomb, "zstd", 1024 * 1024)
    with pytest.raises(BodyTooLargeError):
        decompress(gzip.compress(b"\0" * (64 * 1024 * 1024)), "gzip", 1024 * 1024)
    assert decompress(zstd.compress(b"ab") + zstd.compress(b"cd"), "zstd", 10) == b"abcd"


@pytest.mark.asyncio
async def test_a_full_gateway_answers_429_with_retry_after() -> None:
    backend = InMemoryStubBackend()
    backend.behaviours["refund"] = sleeping(0.5)
    client, _ = await start(backend, max_in_flight=1, max_queue=1)
    try:
        first = [
            asyncio.create_task(client.post("/v1/systemone", json=request_body(), headers=AUTH))
            for _ in range(2)
        ]
        await asyncio.sleep(0.2)  # one judged, one waiting: the next one is refused at once
        response = await client.post("/v1/systemone", json=request_body(), headers=AUTH)
        assert response.status == 429
        assert response.headers["Retry-After"] == "1"
        assert_error_shape(await response.json())
        assert [(await r).status for r in first] == [200, 200]
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_a_request_past_its_timeout_is_a_504() -> None:
    backend = InMemoryStubBackend()
    backend.behaviours["refund"] = sleeping(5)
    client, _ = await start(backend, timeout=0.2)
    try:
        response = await client.post("/v1/systemone", json=request_body(), headers=AUTH)
        assert response.status == 504
        assert_error_shape(await response.json())
        assert "refund" in backend.cancelled
    finally:
        await client.close()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("error", "status"),
    [
        (tv.ServerError("boom", status=500, body=""), 502),
        (tv.TransportError("reset"), 502),
        (tv.ProtocolError("odd"), 502),
        (tv.RequestTimeoutError("slow"), 504),
        (RuntimeError("a bug with a secret"), 500),
    ],
)
async def test_upstream_errors_map_to_statuses(error: Exception, status: int) -> None:
    backend = InMemoryStubBackend()

    async def fail() -> None:
        raise error

    backend.behaviours["refund"] = fail
    client, _ = await start(backend, max_in_flight=1)
    try:
        response = await client.post("/v1/systemone", json=request_body(), headers=AUTH)
        assert response.status == status
        body = await response.json()
        assert_error_shape(body)
        if status == 500:
            assert "secret" not in orjson.dumps(body).decode()
            assert "Traceback" not in orjson.dumps(body).decode()
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_an_unsupported_template_is_a_501() -> None:
    client, _ = await start(InMemoryStubBackend(tv.TemplateFamily.CHATML))
    try:
        response = await client.post("/v1/systemone", json=request_body(), headers=AUTH)
        assert response.status == 501
        assert_error_shape(await response.json())
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_readiness_waits_for_the_probe_and_liveness_does_not() -> None:
    backend = InMemoryStubBackend()
    gate = asyncio.Event()
    probe = backend.probe

    async def slow_probe() -> tv.Probe:
        await gate.wait()
        return await probe()

    backend.probe = slow_probe  # type: ignore[method-assign]
    app = build_app(tv.Session(backend), GatewayConfig(probe_interval=0.01))
    client = await open_client(app, GatewayConfig())
    try:
        assert (await client.get("/healthz")).status == 200
        response = await client.get("/readyz")
        assert response.status == 503
        assert_error_shape(await response.json())
        gate.set()
        for _ in range(100):
            if (await client.get("/readyz")).status == 200:
                break
            await asyncio.sleep(0.01)
        assert (await client.get("/readyz")).status == 200
    finally:
        await client.close()
    assert backend.closed == 1  # the session is closed with the app


@pytest.mark.asyncio
async def test_the_model_list_has_the_served_model(
    client: TestClient[web.Request, web.Application],
) -> None:
    response = await client.get("/v1/models", headers=AUTH)
    assert response.status == 200
    body = await response.json()
    models.ModelMetadataList.model_validate(body)
    assert [m["name"] for m in body["models"]] == ["stub-model"]


@pytest.mark.asyncio
async def test_unknown_routes_keep_the_error_shape(
    client: TestClient[web.Request, web.Application],
) -> None:
    response = await client.get("/nope")
    assert response.status == 404
    assert_error_shape(await response.json())


@pytest.mark.asyncio
async def test_the_access_log_has_no_state_text_and_no_key(
    client: TestClient[web.Request, web.Application], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        response = await client.post("/v1/systemone", json=request_body(), headers=AUTH)
        assert response.status == 200
        await client.post("/v1/systemone", json=request_body(), headers={"Authorization": "x"})
    access = [r for r in caplog.records if r.name == "typevet_async.gateway.access"]
    assert [r.getMessage().split()[:3] for r in access] == [
        ["POST", "/v1/systemone", "200"],
        ["POST", "/v1/systemone", "401"],
    ]
    everything = "\n".join(r.getMessage() for r in caplog.records)
    assert "PRIVATE-STATE-TEXT" not in everything
    assert KEY not in everything


@pytest.mark.asyncio
async def test_metrics_count_requests_and_errors(
    client: TestClient[web.Request, web.Application],
) -> None:
    await client.post("/v1/systemone", json=request_body(), headers=AUTH)
    await client.post("/v1/systemone", json=request_body(questions={}), headers=AUTH)
    text = await (await client.get("/metrics")).text()
    assert 'typevet_gateway_requests_total{route="/v1/systemone",status="200"} 1.0' in text
    assert 'typevet_gateway_requests_total{route="/v1/systemone",status="422"} 1.0' in text
    assert 'typevet_gateway_errors_total{type="SystemOneValidationError"} 1.0' in text
    assert "typevet_gateway_upstream_reads_total 3.0" in text
    assert "typevet_gateway_request_seconds_bucket" in text
