"""The System One gateway (`typevet_async._apps.gateway`) over the in-memory stub backend, through
aiohttp's own test server and client (real HTTP on localhost)."""

from __future__ import annotations

import asyncio
import base64
import gzip
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio
import typesafe_sdk as ts
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from backports import zstd
from typesafe_sdk._schemas import models

import typevet_async as tv
from typevet_async._apps.gateway import (
    BodyTooLargeError,
    GatewayConfig,
    NoKeysError,
    build_app,
    decompress,
    load_keys,
    model_alias,
    runner_options,
    running,
    serve,
)
from typevet_async._apps.gateway.multipart import MultipartPart, media_type, parse_multipart
from typevet_async._core.wires.decoding import CpuClock, DecodeBudget
from typevet_async._core.wires.system_one import NOUL_DEFAULT_INSTRUCTIONS

from .stubs import InMemoryStubBackend, failing_after, sleeping

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
    # The runner's options go to start_server (TestServer's own keywords are not passed on;
    # it sets handler_cancellation itself, as the gateway does).
    options = runner_options(config)
    assert options.pop("handler_cancellation") is True
    await server.start_server(**options)
    client = TestClient(server)
    await client.start_server()
    return client


async def start(
    backend: InMemoryStubBackend | None = None,
    settings: tv.SessionSettings | None = None,
    **config: Any,
) -> tuple[TestClient[web.Request, web.Application], InMemoryStubBackend]:
    backend = backend or InMemoryStubBackend()
    gateway = GatewayConfig(**{"keys": (KEY,), "probe_interval": 0.01, **config})
    app = build_app(tv.Session(backend, settings), gateway)
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


def assert_error_shape(body: Any, status: int | None = None) -> None:
    """A 422's body is the validation list (the official client's ``HTTPValidationError``);
    any other error's ``{"detail": {"error_type", "message"}}`` (jevcompat's ``errors.shape``)."""
    if isinstance(body["detail"], list):
        assert status in (None, 422), body
        models.HTTPValidationError.model_validate(body)
        assert body["detail"]
        assert set(body["detail"][0]) >= {"loc", "msg", "type", "input"}
        return
    assert status != 422, body
    assert set(body) == {"detail"}, body
    assert set(body["detail"]) == {"error_type", "message"}, body
    assert isinstance(body["detail"]["error_type"], str)
    assert isinstance(body["detail"]["message"], str)
    assert body["detail"]["message"]


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
    assert set(body) == {"model", "answers", "usage", "x_typevet"}  # extensions are x_
    for answer in body["answers"].values():
        assert all(
            key in {"type", "noul", "choice", "score", "confidence", "legend", "probabilities"}
            or key.startswith("x_")
            for key in answer
        )


@pytest.mark.asyncio
@pytest.mark.parametrize("header", [None, "Bearer wrong", "Basic " + KEY, "Bearer "])
async def test_a_missing_or_wrong_key_is_a_401_authentication_error(
    client: TestClient[web.Request, web.Application], header: str | None
) -> None:
    headers = {} if header is None else {"Authorization": header}
    for method, path in (("POST", "/v1/systemone"), ("GET", "/v1/models")):
        response = await client.request(method, path, json=request_body(), headers=headers)
        assert response.status == 401
        assert response.headers["WWW-Authenticate"] == "Bearer"
        body = await response.json()
        assert_error_shape(body, 401)
        assert body["detail"]["error_type"] == "authentication_error"
        assert "Authorization: Bearer" in body["detail"]["message"]


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
    assert load_keys(None, None, {"KEYS": "gamma"}) == ()


@pytest.mark.parametrize(
    ("file_text", "variable", "environ", "named"),
    [
        ("\n", None, {}, "--keys-file"),  # what the README's openssl recipe writes without openssl
        ("# only a comment\n  \n", None, {}, "--keys-file"),
        (None, "KEYS", {}, "KEYS: the variable is not set"),
        (None, "KEYS", {"KEYS": " , "}, "KEYS: the variable holds no key"),
        ("alpha\n", "KEYS", {}, "KEYS: the variable is not set"),
    ],
)
def test_a_named_key_source_that_yields_no_key_is_refused(
    tmp_path: Any, file_text: str | None, variable: str | None, environ: dict[str, str], named: str
) -> None:
    path = None
    if file_text is not None:
        path = tmp_path / "keys"
        path.write_text(file_text)
    with pytest.raises(NoKeysError, match=named):
        load_keys(path, variable, environ)


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
    assert [entry["type"] for entry in detail["detail"]] == ["unsupported", "value_error"]
    assert "box questions are not supported" in detail["detail"][0]["msg"]
    for raw in (b"{not json", b"[1, 2]"):
        response = await client.post("/v1/systemone", data=raw, headers=AUTH)
        assert response.status == 422
        assert_error_shape(await response.json())


@pytest.mark.asyncio
async def test_a_noul_without_instructions_and_a_document_are_answered(
    client: TestClient[web.Request, web.Application],
) -> None:
    threat = {"type": "noul", "criteria": {"true": "A chargeback threat", "false": "No threat"}}
    body = request_body(questions={"threat": threat})
    body["document"] = body.pop("state")
    response = await client.post("/v1/systemone", json=body, headers=AUTH)
    assert response.status == 200
    answered = await response.json()
    models.SystemOneResponse.model_validate(answered)
    prompt = answered["x_typevet"]["diagnostics"]["threat"]["prompt"]
    assert STATE_TEXT in prompt
    # a Noul is asked in words (the default)
    assert f"{NOUL_DEFAULT_INSTRUCTIONS}\nNo: No threat\nYes: A chargeback threat\n" in prompt
    both = {**body, "state": STATE_TEXT}
    response = await client.post("/v1/systemone", json=both, headers=AUTH)
    assert response.status == 422
    refused = await response.json()
    assert_error_shape(refused, 422)
    assert refused["detail"][0]["loc"] == ["body", "document"]


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
    budget = DecodeBudget(max_bytes=1024 * 1024)
    with pytest.raises(BodyTooLargeError):
        decompress(bomb, "zstd", budget, CpuClock(10))
    with pytest.raises(BodyTooLargeError):
        decompress(gzip.compress(b"\0" * (64 * 1024 * 1024)), "gzip", budget, CpuClock(10))
    two_frames = zstd.compress(b"ab") + zstd.compress(b"cd")
    assert decompress(two_frames, "zstd", DecodeBudget(max_bytes=10), CpuClock(10)) == b"abcd"


@pytest.mark.asyncio
async def test_a_full_gateway_answers_429_with_retry_after() -> None:
    backend = InMemoryStubBackend()
    backend.behaviours["refund"] = sleeping(0.5)
    client, _ = await start(backend, max_active_requests=1, max_queue=1)
    try:
        first = [
            asyncio.create_task(client.post("/v1/systemone", json=request_body(), headers=AUTH))
            for _ in range(2)
        ]
        await asyncio.sleep(0.2)  # one judged, one waiting: the next one is refused at once
        response = await client.post("/v1/systemone", json=request_body(), headers=AUTH)
        assert response.status == 429
        assert response.headers["Retry-After"] == "1"  # nothing measured yet
        assert response.headers["retry-after-ms"] == "1000"
        assert_error_shape(await response.json())
        assert [(await r).status for r in first] == [200, 200]
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_a_request_past_its_timeout_is_a_504() -> None:
    backend = InMemoryStubBackend()
    backend.behaviours["refund"] = sleeping(5)
    client, _ = await start(backend, request_deadline=0.2)
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
    client, _ = await start(backend, max_active_requests=1)
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
@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (400, '{"error": {"message": "m is not a multimodal model", "code": 400}}',
         "(HTTP 400): m is not a multimodal model"),
        (400, "the request exceeds the available context size", "exceeds the available context"),
        (413, "", "(HTTP 413): "),
    ],
)  # fmt: skip
async def test_an_upstream_refusal_of_the_request_is_a_422_not_a_retried_5xx(
    status: int, body: str, message: str
) -> None:
    backend = InMemoryStubBackend()

    async def refuse() -> None:
        raise tv.ServerError(f"POST http://upstream/x: HTTP {status}", status=status, body=body)

    backend.behaviours["refund"] = refuse
    client, _ = await start(backend)
    try:
        response = await client.post("/v1/systemone", json=request_body(), headers=AUTH)
        assert response.status == 422
        detail = (await response.json())["detail"][0]
    finally:
        await client.close()
    assert detail["type"] == "upstream_refused"
    assert message in detail["msg"]
    assert "http://upstream" not in detail["msg"]  # the upstream's address stays inside


@pytest.mark.asyncio
async def test_an_unsupported_template_is_a_501() -> None:
    client, _ = await start(InMemoryStubBackend(tv.TemplateFamily.DEGRADED))
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
async def test_the_gateway_names_its_version_in_the_model_list_and_every_server_header(
    client: TestClient[web.Request, web.Application],
) -> None:
    listed = await client.get("/v1/models", headers=AUTH)
    assert (await listed.json())["x_typevet_version"] == tv.__version__
    refused = await client.get("/v1/models")  # no key: a 401 from the auth middleware
    for response in (listed, refused, await client.get("/healthz"), await client.get("/nope")):
        assert response.headers["Server"] == f"typevet-async/{tv.__version__}"


@pytest.mark.asyncio
async def test_unknown_routes_keep_the_error_shape(
    client: TestClient[web.Request, web.Application],
) -> None:
    response = await client.get("/nope")
    assert response.status == 404
    body = await response.json()
    assert_error_shape(body, 404)
    assert body["detail"] == {"error_type": "http_error", "message": "Not Found"}


@pytest.mark.asyncio
async def test_the_official_client_raises_its_typed_error_with_the_message_and_request_id(
    client: TestClient[web.Request, web.Application],
) -> None:
    async with ts.AsyncTypeSafeClient(
        api_key="wrong", base_url=str(client.make_url("")), retry=ts.RetryPolicy(max_retries=0)
    ) as official:
        with pytest.raises(ts.TypeSafeAuthenticationError) as raised:
            await official.system_one(
                state="x", questions={"q": ts.Noul(instructions="Is it damaged?")}
            )
    assert raised.value.status == 401
    assert raised.value.body["detail"]["error_type"] == "authentication_error"
    assert raised.value.request_id is not None
    assert re.fullmatch(r"req_[0-9a-f]{24}", raised.value.request_id)
    # its message reader takes ``detail.message``
    assert "a valid bearer key is required" in str(raised.value)
    assert f"(request_id={raised.value.request_id})" in str(raised.value)


@pytest.mark.asyncio
async def test_every_response_names_its_request_with_a_fresh_id(
    client: TestClient[web.Request, web.Application], caplog: pytest.LogCaptureFixture
) -> None:
    forged = {"x-typesafe-request-id": "req_forged"}
    with caplog.at_level(logging.INFO, logger="typevet_async.gateway.access"):
        sent = [
            await client.post("/v1/systemone", json=request_body(), headers={**AUTH, **forged}),
            await client.post("/v1/systemone", json=request_body(), headers=forged),
            await client.post("/v1/systemone", json={"model": "m"}, headers=AUTH),
            await client.get("/nope"),
            await client.get("/healthz"),
            await client.get("/v1/models", headers=AUTH),
        ]
    assert [response.status for response in sent] == [200, 401, 422, 404, 200, 200]
    ids = [response.headers["x-typesafe-request-id"] for response in sent]
    assert all(re.fullmatch(r"req_[0-9a-f]{24}", request_id) for request_id in ids), ids
    assert len(set(ids)) == len(ids)  # a fresh one each time; a client's is not echoed
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert all(request_id in logged for request_id in ids)  # the access log names each


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
    assert "typevet_gateway_upstream_reads_total 3.0" in text  # three questions
    assert "typevet_gateway_request_seconds_bucket" in text


# -- multipart bodies (what the official client sends when a request has image assets) -------

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8  # 2 KiB: the client zstd-compresses it
JPEG = b"\xff\xd8\xff\xe0" + b"\x01" * 600


def multipart(parts: list[tuple[str, str, bytes]], boundary: str = "b0undary") -> bytes:
    """A multipart/form-data body written here, part by part (not by the client under test)."""
    chunks = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n'
        f"Content-Type: {kind}\r\n\r\n".encode()
        + data
        + b"\r\n"
        for name, kind, data in parts
    ]
    return b"".join(chunks) + f"--{boundary}--\r\n".encode()


MULTIPART = {**AUTH, "Content-Type": "multipart/form-data; boundary=b0undary"}


def with_assets(state: str, assets: dict[str, Any]) -> bytes:
    return orjson.dumps({**request_body(state=state), "assets": assets})


@pytest.mark.asyncio
async def test_the_official_clients_multipart_images_reach_the_judgment_in_order() -> None:
    from typesafe_sdk._core.compression import MIN_COMPRESSED_BODY_LENGTH, resolve_compression

    assert resolve_compression(None) == "zstd"  # so the client compresses the multipart body
    assert len(PNG) > MIN_COMPRESSED_BODY_LENGTH
    client, backend = await start(InMemoryStubBackend(vision=True))
    logo, receipt = ts.Image(JPEG), ts.Image(PNG)
    try:
        async with ts.AsyncTypeSafeClient(
            api_key=KEY, base_url=str(client.make_url("")), retry=ts.RetryPolicy(max_retries=0)
        ) as official:
            with official.attach_assets([logo, receipt]):
                response = await official.system_one(
                    state=f"Receipt: {receipt}. Logo: {logo}.",
                    questions={"refund": ts.Noul(instructions=f"Is {logo} ours?")},
                )
    finally:
        await client.close()
    assert 0 <= response.nouls["refund"].noul <= 1
    [read] = backend.read_requests
    images = [image for message in read.messages for image in message.images]
    # In placeholder order: the state names the receipt first.
    assert [image.data_uri()[:15] for image in images] == ["data:image/png;", "data:image/jpeg"]
    assert [image.data for image in images] == [PNG, JPEG]
    assert "Receipt: [image 1]. Logo: [image 2]." in read.user_text
    assert "Is [image 2] ours?" in read.user_text


@pytest.mark.asyncio
async def test_a_multipart_request_is_read_with_json_assets_beside_its_parts() -> None:
    client, backend = await start(InMemoryStubBackend(vision=True))
    inline = {"type": "image", "format": "jpeg", "data_base64": base64.b64encode(JPEG).decode()}
    request = with_assets("a: <a>, b: <b>", {"<a>": {"type": "image", "part": "p"}, "<b>": inline})
    body = multipart([("request", "application/json", request), ("p", "image/png", PNG)])
    try:
        response = await client.post(
            "/v1/systemone", data=b"preamble\r\n" + body, headers=MULTIPART
        )
        assert response.status == 200, await response.text()
        models.SystemOneResponse.model_validate(await response.json())
    finally:
        await client.close()
    judged = [r for r in backend.read_requests if message_images(r)]  # not a Score's prior
    images = [image.data for message in judged[0].messages for image in message.images]
    assert images == [PNG, JPEG]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("parts", "loc", "message"),
    [
        ([("p", "image/png", PNG)], ["body", "request"], "part named 'request'"),
        ([("request", "application/json", b"{nope")], ["body", "request"], "not valid JSON"),
        (
            [("request", "application/json", with_assets("<a>", {"<a>": {"part": "q"}}))],
            ["body", "assets", "<a>", "part"],
            "no part of the body is named 'q'",
        ),
        (
            [
                ("request", "application/json",
                 with_assets("<a> <b>", {"<a>": {"part": "p"}, "<b>": {"part": "p"}})),
                ("p", "image/png", PNG),
            ],
            ["body", "assets", "<b>", "part"],
            "already claimed by asset '<a>'",
        ),
        (
            [
                ("request", "application/json", with_assets("<a>", {"<a>": {"part": "p"}})),
                ("p", "image/png", PNG),
                ("stray", "image/png", PNG),
            ],
            ["body", "stray"],
            "no asset claims this part",
        ),
        (
            [
                ("request", "application/json", with_assets("<a>", {"<a>": {"part": "p"}})),
                ("p", "application/octet-stream", b"GIF89a" + b"\0" * 32),
            ],
            ["body", "assets", "<a>", "part"],
            "not a PNG or JPEG image",
        ),
    ],
)  # fmt: skip
async def test_a_bad_multipart_request_is_a_422_naming_the_problem(
    client: TestClient[web.Request, web.Application],
    parts: list[tuple[str, str, bytes]],
    loc: list[str],
    message: str,
) -> None:
    response = await client.post("/v1/systemone", data=multipart(parts), headers=MULTIPART)
    assert response.status == 422
    body = await response.json()
    assert_error_shape(body)
    assert body["detail"][0]["loc"] == loc
    assert message in body["detail"][0]["msg"]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "body",
    [
        b"no boundary here",
        b'--b0undary\r\nContent-Disposition: form-data; name="request"\r\n\r\n{}',  # no close
        b"--b0undary\r\nno-colon-header\r\n\r\n{}\r\n--b0undary--\r\n",
        b"--b0undary\r\nContent-Type: text/plain\r\n\r\n{}\r\n--b0undary--\r\n",  # no name
        b"--b0undaryX\r\n\r\n{}\r\n--b0undary--\r\n",
    ],
)
async def test_a_malformed_multipart_body_is_a_422(
    client: TestClient[web.Request, web.Application], body: bytes
) -> None:
    response = await client.post("/v1/systemone", data=body, headers=MULTIPART)
    assert response.status == 422
    detail = await response.json()
    assert_error_shape(detail)
    assert detail["detail"][0]["type"] == "multipart_invalid"


@pytest.mark.asyncio
async def test_multipart_needs_form_data_with_a_boundary(
    client: TestClient[web.Request, web.Application],
) -> None:
    body = multipart([("request", "application/json", orjson.dumps(request_body()))])
    no_boundary = {**AUTH, "Content-Type": "multipart/form-data"}
    response = await client.post("/v1/systemone", data=body, headers=no_boundary)
    assert response.status == 422
    assert (await response.json())["detail"][0]["loc"] == ["header", "content-type"]
    mixed = {**AUTH, "Content-Type": "multipart/mixed; boundary=b0undary"}
    response = await client.post("/v1/systemone", data=body, headers=mixed)
    assert response.status == 415
    assert_error_shape(await response.json())
    quoted = {**AUTH, "Content-Type": 'multipart/form-data; boundary="b0undary"'}
    assert (await client.post("/v1/systemone", data=body, headers=quoted)).status == 200


@pytest.mark.asyncio
async def test_a_multipart_body_past_the_limit_is_a_413() -> None:
    small, _ = await start(InMemoryStubBackend(vision=True), max_body_bytes=4096)
    request = with_assets("<a>", {"<a>": {"part": "p"}})
    body = multipart([("request", "application/json", request), ("p", "image/png", PNG * 3)])
    try:
        response = await small.post("/v1/systemone", data=body, headers=MULTIPART)
        assert response.status == 413
        assert_error_shape(await response.json())
        # zstd-compressed below the cap, inflating past it: still a 413.
        packed = zstd.compress(body)
        assert len(packed) < 4096
        headers = {**MULTIPART, "Content-Encoding": "zstd"}
        assert (await small.post("/v1/systemone", data=packed, headers=headers)).status == 413
    finally:
        await small.close()


@pytest.mark.asyncio
async def test_images_for_a_server_without_vision_are_the_clients_422(
    client: TestClient[web.Request, web.Application],
) -> None:
    image = ts.Image(PNG)
    async with ts.AsyncTypeSafeClient(
        api_key=KEY, base_url=str(client.make_url("")), retry=ts.RetryPolicy(max_retries=0)
    ) as official:
        with pytest.raises(ts.TypeSafeUnprocessableEntityError) as raised:
            await official.system_one(
                state=f"Photo: {image}",
                questions={"q": ts.Noul(instructions="Is it damaged?")},
                assets={str(image): image},
            )
    assert raised.value.status == 422
    assert_error_shape(raised.value.body)
    assert "does not declare vision" in raised.value.body["detail"][0]["msg"]


def test_multipart_is_read_as_the_rfc_writes_it() -> None:
    assert media_type('Multipart/Form-Data; boundary="x"') == "multipart/form-data"
    assert media_type("application/json") == "application/json"
    parts = parse_multipart(
        b"pre\r\n" + multipart([("a", "t/x", b"1\r\n2")]) + b"epilogue",
        "multipart/form-data; boundary=b0undary",
    )
    assert parts == [MultipartPart("a", "t/x", b"1\r\n2")]


# -- graceful shutdown (the real SIGTERM is sent in tests/live/test_gateway_live.py) ----------


async def serving(
    backend: InMemoryStubBackend, stop: asyncio.Event, **config: Any
) -> tuple[asyncio.Task[None], str]:
    urls: asyncio.Queue[str] = asyncio.Queue()
    gateway = GatewayConfig(**{"keys": (KEY,), "probe_interval": 0.01, **config})
    task = asyncio.create_task(
        serve(tv.Session(backend), gateway, "127.0.0.1", 0, started=urls.put_nowait, stop=stop)
    )
    return task, await asyncio.wait_for(urls.get(), 10)


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition did not hold within 5 s")


async def refused(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    try:
        _, writer = await asyncio.open_connection(host, int(port))
    except ConnectionRefusedError:
        return True
    writer.close()
    await writer.wait_closed()
    return False


@pytest.mark.asyncio
async def test_a_shutdown_refuses_new_connections_and_finishes_the_requests_in_flight() -> None:
    backend = InMemoryStubBackend()
    backend.behaviours["refund"] = sleeping(1.0)
    stop = asyncio.Event()
    task, url = await serving(backend, stop, max_active_requests=2, shutdown_timeout=10)
    async with aiohttp.ClientSession() as http:

        async def ask() -> tuple[int, Any]:
            async with http.post(f"{url}/v1/systemone", json=request_body(), headers=AUTH) as r:
                return r.status, await r.json()

        asked = [asyncio.create_task(ask()) for _ in range(4)]  # 2 judged, 2 waiting
        await until(lambda: backend.in_flight == 2)
        stop.set()
        await asyncio.sleep(0.05)
        assert await refused(url)
        assert not any(a.done() for a in asked)
        answered = await asyncio.gather(*asked)
    await asyncio.wait_for(task, 10)
    assert [status for status, _ in answered] == [200] * 4
    for _, body in answered:
        models.SystemOneResponse.model_validate(body)
    assert backend.cancelled == []
    assert backend.closed == 1


@pytest.mark.asyncio
async def test_judgments_past_the_shutdown_timeout_answer_503() -> None:
    backend = InMemoryStubBackend()
    backend.behaviours["refund"] = sleeping(60)
    stop = asyncio.Event()
    task, url = await serving(backend, stop, max_active_requests=1, shutdown_timeout=0.5)
    async with aiohttp.ClientSession() as http:

        async def ask() -> tuple[int, Any, str | None]:
            async with http.post(f"{url}/v1/systemone", json=request_body(), headers=AUTH) as r:
                return r.status, await r.json(), r.headers.get("Retry-After")

        asked = [asyncio.create_task(ask()) for _ in range(2)]  # 1 judged, 1 waiting
        await until(lambda: backend.in_flight == 1)
        await asyncio.sleep(0.1)
        started = time.monotonic()
        stop.set()
        answered = await asyncio.gather(*asked)
        await asyncio.wait_for(task, 5)
        elapsed = time.monotonic() - started
    assert [(status, retry) for status, _, retry in answered] == [(503, "1")] * 2
    for _, body, _ in answered:
        assert_error_shape(body, 503)
        assert body["detail"]["error_type"] == "unavailable"
        assert "shut down" in body["detail"]["message"]
    assert "refund" in backend.cancelled
    assert backend.closed == 1
    # The timeout, then the cut-off and the session's close (no read is waited for).
    assert 0.5 <= elapsed < 2.0, elapsed


# -- hostile clients and faults (issue 31) ---------------------------------------------------


@pytest.mark.asyncio
async def test_a_probe_refusal_is_probed_again_until_the_server_is_fixed() -> None:
    # One refusal at startup left /readyz and /v1/models at 503 for good.
    backend = InMemoryStubBackend()
    backend.probe_failures = [
        tv.UnsupportedTemplateError("not a template the SDK judges", family="?", rendered=""),
        tv.ConfigurationError("the pinned model is not served"),
    ]
    gateway = GatewayConfig(keys=(KEY,), probe_interval=0.01)
    client = await open_client(build_app(tv.Session(backend), gateway), gateway)
    try:
        for _ in range(300):
            if (await client.get("/readyz")).status == 200:
                break
            await asyncio.sleep(0.01)
        assert (await client.get("/readyz")).status == 200
        assert (await client.get("/v1/models", headers=AUTH)).status == 200
        assert backend.probes == 3
    finally:
        await client.close()


async def raw_exchange(client: TestClient[web.Request, web.Application], head: bytes) -> bytes:
    """``head`` sent as it is on a new connection; what the server sends back until it closes."""
    host, port = client.server.host, client.server.port
    assert port is not None
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(head)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


@pytest.mark.asyncio
async def test_a_bearer_key_that_is_not_utf8_is_a_401(
    client: TestClient[web.Request, web.Application],
) -> None:
    # It was a 500 with a traceback, no key needed.
    body = orjson.dumps(request_body())
    head = (
        b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nAuthorization: Bearer \xe9\xe9\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    reply = await raw_exchange(client, head)
    assert reply.startswith(b"HTTP/1.1 401"), reply[:200]
    assert b"Traceback" not in reply


@pytest.mark.asyncio
async def test_idle_and_trickling_connections_are_closed() -> None:
    client, _ = await start(idle_timeout=0.5, body_timeout=0.5)
    try:
        host, port = client.server.host, client.server.port
        assert port is not None
        began = time.monotonic()
        idle = [await asyncio.open_connection(host, port) for _ in range(20)]
        trickling = await asyncio.open_connection(host, port)
        trickling[1].write(b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\n")  # a head never ended
        for reader, _ in [*idle, trickling]:
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
        assert time.monotonic() - began < 4
        for _, writer in [*idle, trickling]:
            writer.close()
        # A body that never finishes arriving: 408 once the body timeout passes.
        head = (
            b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
            + b"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\""
        )  # fmt: skip
        reply = await raw_exchange(client, head)
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
        assert (await client.get("/healthz")).status == 200
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_a_client_that_goes_away_cancels_its_judgment_and_frees_its_slot(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = InMemoryStubBackend()
    backend.state_behaviours[STATE_TEXT] = sleeping(30)
    client, _ = await start(backend, max_active_requests=1, max_queue=0)
    try:
        with caplog.at_level(logging.INFO, logger="typevet_async.gateway.access"):
            with pytest.raises(asyncio.TimeoutError):
                await client.post(
                    "/v1/systemone", json=request_body(), headers=AUTH,
                    timeout=aiohttp.ClientTimeout(total=0.5),
                )  # fmt: skip
            for _ in range(200):
                if backend.cancelled and backend.in_flight == 0:
                    break
                await asyncio.sleep(0.01)
            assert backend.cancelled  # the reads were cancelled, not left running
            assert backend.in_flight == 0
            # its slot is free: the next request is judged, not shed with a 429
            backend.state_behaviours.clear()
            response = await client.post("/v1/systemone", json=request_body(), headers=AUTH)
            assert response.status == 200
        lines = [r.getMessage() for r in caplog.records if r.name.endswith("access")]
        assert any(" 499 " in line for line in lines), lines
    finally:
        await client.close()


def png_declaring(width: int, height: int) -> bytes:
    """A small, well-formed PNG whose header declares ``width`` x ``height`` (its data is a
    few rows of nothing: the point is what the header says)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data)
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    pixels = zlib.compress(b"\0" * 1024)
    signature = b"\x89PNG\r\n\x1a\n"
    return signature + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


@pytest.mark.asyncio
async def test_an_image_declaring_too_many_pixels_is_a_422_never_forwarded() -> None:
    # A 441-byte request carrying a 20,000 x 20,000 PNG was forwarded to a vision upstream.
    huge = png_declaring(20_000, 20_000)
    assert len(huge) < 500
    assert tv.Image.from_bytes(png_declaring(4_000, 3_000), "image/png")  # 12 MP: fine
    client, backend = await start(InMemoryStubBackend(vision=True))
    asset = {"type": "image", "format": "png", "data_base64": base64.b64encode(huge).decode()}
    try:
        response = await client.post(
            "/v1/systemone", json=request_body(state="see <a>", assets={"<a>": asset}), headers=AUTH
        )
        assert response.status == 422
        assert "20000 x 20000 pixels" in (await response.text())
    finally:
        await client.close()
    assert backend.read_requests == []


@pytest.mark.asyncio
async def test_a_5xx_never_names_the_upstream_address() -> None:
    # A 502 body named the gateway's internal upstream URL.
    backend = InMemoryStubBackend()
    backend.behaviours["refund"] = failing_after(
        0.0,
        tv.ServerError(
            "POST http://10.1.2.3:8080/completion: HTTP 500: slot 3 crashed",
            status=500,
            body='{"error": {"message": "slot 3 crashed at /srv/models/x.gguf"}}',
        ),
    )
    client, _ = await start(backend)
    try:
        response = await client.post("/v1/systemone", json=request_body(), headers=AUTH)
        assert response.status == 502
        text = await response.text()
    finally:
        await client.close()
    assert "10.1.2.3" not in text
    assert "/srv/models" not in text
    assert "ServerError: the model server answered with an error (HTTP 500)" in text


@pytest.mark.parametrize(
    ("served", "shown"),
    [
        ("/root/.cache/typevet_async/models/gemma-3-270m-q4_k_m.gguf", "gemma-3-270m-q4_k_m"),
        ("C:\\models\\qwen.gguf", "qwen"),
        ("model.gguf", "model"),
        ("gemma3-270m", "gemma3-270m"),
        (None, None),
    ],
)
def test_a_model_served_from_a_file_is_shown_by_its_name_not_its_path(
    served: str | None, shown: str | None
) -> None:
    assert model_alias(served) == shown


async def silent_connections(
    url: str, count: int
) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """``count`` TCP connections to the gateway that send nothing, opened in turn."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return [await asyncio.open_connection(host, int(port)) for _ in range(count)]


@pytest.mark.asyncio
async def test_at_the_connection_cap_the_connection_idle_longest_makes_room() -> None:
    # While 300 silent connections were open, /healthz answered 503 to every client until the
    # idle timeout closed them: the cap turned new clients away instead of idle sockets.
    backend = InMemoryStubBackend()
    release = asyncio.Event()

    async def held() -> None:
        await release.wait()

    backend.state_behaviours["in progress"] = held
    config = GatewayConfig(keys=(KEY,), max_connections=20, idle_timeout=60.0)
    async with running(tv.Session(backend), config) as url, aiohttp.ClientSession() as http:
        body = request_body(state="in progress")
        busy = asyncio.create_task(http.post(f"{url}/v1/systemone", json=body, headers=AUTH))
        await until(lambda: backend.in_flight > 0)
        # 60 silent connections through a cap of 20, the request in progress holding one:
        # each new one closes the one idle longest, so the last 19 are open, the others closed.
        silent = await silent_connections(url, 60)
        for reader, _ in silent[:41]:
            assert await asyncio.wait_for(reader.read(), 5) == b""
        await asyncio.sleep(0.05)
        assert not any(reader.at_eof() for reader, _ in silent[41:])
        async with aiohttp.ClientSession() as other, other.get(f"{url}/healthz") as health:
            assert health.status == 200
        release.set()
        response = await busy  # never cut to make room
        assert response.status == 200
        for _, writer in silent:
            writer.close()


@pytest.mark.asyncio
async def test_connections_past_the_cap_get_a_503_at_once_when_none_is_idle() -> None:
    config = GatewayConfig(keys=(KEY,), max_connections=20)
    async with running(tv.Session(InMemoryStubBackend()), config) as url:
        # 20 requests in progress: each has sent its head and waits to send its body
        head = (
            b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: 10\r\n\r\n"
        )
        sending = await silent_connections(url, 20)
        for _, writer in sending:
            writer.write(head)
        await asyncio.sleep(0.1)  # accepted and read
        [(reader, writer)] = await silent_connections(url, 1)
        reply = await asyncio.wait_for(reader.read(), 2)  # answered and closed, not held
        writer.close()
        assert reply.startswith(b"HTTP/1.1 503"), reply[:100]
        head_of_reply, body = reply.split(b"\r\n\r\n", 1)
        assert_error_shape(orjson.loads(body), 503)
        assert re.search(
            rb"\r\nx-typesafe-request-id: req_[0-9a-f]{24}\r\n", head_of_reply + b"\r\n"
        )
        for sending_reader, _ in sending:  # none was cut for it
            assert not sending_reader.at_eof()
        for _, sending_writer in sending:
            sending_writer.close()


def test_the_default_connection_cap_is_half_the_descriptor_limit() -> None:
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    expected = 4096 if soft == resource.RLIM_INFINITY else max(16, soft // 2)
    assert GatewayConfig().connection_cap() == expected
    assert GatewayConfig(max_connections=7).connection_cap() == 7


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_active_requests", 0), ("max_queue", -1), ("request_deadline", 0.0),
        ("max_body_bytes", 0),
        ("max_questions", 0), ("max_assets", -3), ("max_items", 0), ("max_depth", 0),
        ("decode_cpu_seconds", float("nan")), ("decode_threads", 0), ("idle_timeout", -1.0),
        ("body_timeout", float("inf")), ("max_connections", 0), ("shutdown_timeout", 0),
        ("probe_interval", "1"), ("max_questions", True), ("keys", ("k", 3)),
    ],
)  # fmt: skip
def test_a_bad_gateway_setting_is_refused_when_built_naming_it(field: str, value: Any) -> None:
    # Before, a bad limit surfaced only as a broken request (a 422 for a budget of 0, or a
    # CapacityLimiter that would not build).
    with pytest.raises(tv.ConfigurationError, match=field):
        GatewayConfig(**{field: value})


def message_images(request: tv.ScoringRequest) -> list[object]:
    """The images of a read's messages (a content-free prior's reads have none)."""
    return [image for message in request.messages for image in message.images]
