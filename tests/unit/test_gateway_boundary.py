"""What crosses the System One gateway's trust boundary besides the answers (issue 43): its
log lines carry an upstream failure's type and status, never the upstream's reply (which may
quote the customer's prompt) unless the content switch is on; and a caller's ``tracestate``
and ``baggage`` reach the model server only when the gateway is told to forward them.

Over the in-memory stub backend through aiohttp's test server; the headers "sent to the model
server" are those `typevet_async._telemetry.with_trace_context` gives a read, which is how
every backend builds its requests' headers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

import typevet_async as tv
import typevet_async._telemetry as telemetry
from tests.otel import Recorded, installed
from typevet_async._apps.cli import main
from typevet_async._apps.gateway import GatewayConfig
from typevet_async._core.wires.system_one import BATCH_PATH

from .stubs import Behaviour, InMemoryStubBackend, failing_after
from .test_gateway import AUTH, request_body, start

#: Text of the customer's that an upstream quotes back in its error reply.
SECRET = "PRIVATE-CUSTOMER-TEXT-5e1f"
QUOTING_REPLY = json.dumps({"error": {"message": f"cannot score prompt: '{SECRET}'"}})


def everything_logged(caplog: pytest.LogCaptureFixture) -> str:
    """Every record's message, its fields and its formatted traceback, as one text."""
    parts: list[Any] = [caplog.text]
    for record in caplog.records:
        parts += [record.getMessage(), {k: v for k, v in vars(record).items() if k != "msg"}]
    return json.dumps(parts, default=str)


def gateway_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "typevet_async.gateway" and r.levelno >= 30]


def quoting_upstream() -> InMemoryStubBackend:
    backend = InMemoryStubBackend()
    error = tv.ServerError(f"HTTP 500: {QUOTING_REPLY}", status=500, body=QUOTING_REPLY)
    backend.behaviours["refund"] = failing_after(0.0, error)
    return backend


def batch_of(states: list[Any]) -> dict[str, Any]:
    body = request_body()
    del body["state"]
    body["states"] = states
    return body


# -- logs: type and status, never the upstream's reply --------------------------------------------


@pytest.mark.asyncio
async def test_an_upstream_failure_is_logged_by_type_and_status_never_its_reply(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # `judgment failed: ServerError ... HTTP 500: <upstream reply>` put the customer's text,
    # quoted by the upstream, in the gateway's WARNING log.
    caplog.set_level(logging.DEBUG, logger="typevet_async")
    client, _ = await start(quoting_upstream())
    try:
        single = await client.post("/v1/systemone", json=request_body(), headers=AUTH)
        assert single.status == 502
        batch = await client.post(BATCH_PATH, json=batch_of(["one"]), headers=AUTH)
        assert (await batch.json())["results"][0]["error"]["status"] == 502
    finally:
        await client.close()
    assert SECRET not in everything_logged(caplog)
    messages = [(r.levelname, r.getMessage()) for r in gateway_warnings(caplog)]
    assert messages == [
        ("WARNING", "judgment failed: ServerError (HTTP 500)"),
        ("WARNING", "batch item failed: ServerError (HTTP 500)"),
    ]
    for record in gateway_warnings(caplog):
        assert (record.error_type, record.status) == ("ServerError", 500)  # type: ignore[attr-defined]


@pytest.mark.asyncio
async def test_with_content_capture_on_the_log_keeps_the_upstreams_reply(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true: a debugging session's choice.
    monkeypatch.setattr(telemetry, "CAPTURE_CONTENT", True)
    caplog.set_level(logging.DEBUG, logger="typevet_async")
    client, _ = await start(quoting_upstream())
    try:
        assert (await client.post("/v1/systemone", json=request_body(), headers=AUTH)).status == 502
    finally:
        await client.close()
    [warning] = gateway_warnings(caplog)
    assert warning.getMessage().startswith("judgment failed: ServerError: ")
    assert SECRET in warning.getMessage()
    assert warning.getMessage().endswith("(HTTP 500)")


def raising_a_bug() -> Behaviour:
    async def behaviour() -> None:
        raise RuntimeError(f"a bug that quotes {SECRET}")

    return behaviour


@pytest.mark.asyncio
async def test_a_bug_is_logged_with_its_frames_and_not_its_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="typevet_async")
    backend = InMemoryStubBackend()
    backend.behaviours["refund"] = raising_a_bug()
    client, _ = await start(backend)
    try:
        single = await client.post("/v1/systemone", json=request_body(), headers=AUTH)
        assert single.status == 500
        batch = await client.post(BATCH_PATH, json=batch_of(["one"]), headers=AUTH)
        assert (await batch.json())["results"][0]["error"]["status"] == 500
    finally:
        await client.close()
    assert SECRET not in everything_logged(caplog)
    errors = [r for r in gateway_warnings(caplog) if r.levelname == "ERROR"]
    assert [r.getMessage().split("\n", 1)[0] for r in errors] == [
        "unexpected error on POST /v1/systemone: RuntimeError",
        "batch item failed: RuntimeError",
    ]
    for record in errors:  # where it happened is kept: the frames, down to the raise
        assert "in behaviour" in record.getMessage()
        assert record.exc_info is None


# -- the caller's tracestate and baggage -------------------------------------------------------

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_HEADERS = {
    "traceparent": f"00-{CALLER_TRACE}-b7ad6b7169203331-01",
    "tracestate": "vendor=caller-chosen-state",
    "baggage": "customer.email=someone%40example.com,tenant=acme",
}


@pytest.fixture
def otel() -> Iterator[Recorded]:
    with installed() as recorded:
        yield recorded


def recording_headers(sent: list[dict[str, str]]) -> Behaviour:
    """A read that keeps the trace headers a backend would send with it."""

    async def behaviour() -> None:
        sent.append(dict(telemetry.with_trace_context({}) or {}))

    return behaviour


async def headers_sent_upstream(**config: Any) -> dict[str, str]:
    backend = InMemoryStubBackend()
    sent: list[dict[str, str]] = []
    backend.behaviours["refund"] = recording_headers(sent)
    client, _ = await start(backend, **config)
    try:
        headers = {**AUTH, **CALLER_HEADERS}
        response = await client.post("/v1/systemone", json=request_body(), headers=headers)
        assert response.status == 200
    finally:
        await client.close()
    [read] = sent
    return read


@pytest.mark.asyncio
@pytest.mark.usefixtures("otel")
async def test_the_callers_tracestate_and_baggage_stop_at_the_gateway_by_default() -> None:
    read = await headers_sent_upstream()
    # The trace is joined: the read is in the caller's trace.
    assert read["traceparent"].split("-")[1] == CALLER_TRACE
    # What the caller chose to put in it is not carried to the model server.
    assert "tracestate" not in read
    assert "baggage" not in read


@pytest.mark.asyncio
@pytest.mark.usefixtures("otel")
async def test_forwarding_them_is_a_setting() -> None:
    read = await headers_sent_upstream(forward_tracestate_baggage=True)
    assert read["traceparent"].split("-")[1] == CALLER_TRACE
    assert read["tracestate"] == CALLER_HEADERS["tracestate"]
    assert read["baggage"] == CALLER_HEADERS["baggage"]


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_the_setting_is_a_bool(value: Any) -> None:
    with pytest.raises(tv.ConfigurationError, match="forward_tracestate_baggage"):
        GatewayConfig(forward_tracestate_baggage=value)


def test_the_serve_flag_sets_it_and_takes_no_value(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    configs: list[GatewayConfig] = []

    async def serving(session: tv.Session, config: GatewayConfig, *args: Any) -> None:
        configs.append(config)

    monkeypatch.setattr("typevet_async._apps.gateway.serve", serving)
    argv = ["serve", "--base-url", "http://127.0.0.1:9", "--no-auth"]
    assert main(argv) == 0
    assert main([*argv, "--forward-tracestate-baggage"]) == 0
    assert [c.forward_tracestate_baggage for c in configs] == [False, True]
    capsys.readouterr()
    assert main([*argv, "--forward-tracestate-baggage=yes"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--forward-tracestate-baggage" in err
