"""The HTTP shell against a fault-injecting stub server (named as such): a real llama.cpp
server cannot be made to drop a connection mid-request, or to redirect, on cue."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import pytest
import pytest_asyncio

import typevet_async as tv
from typevet_async._backends.http import Attempts, HttpClient, RetryPolicy

pytestmark = pytest.mark.asyncio

Handler = Callable[[int, int], bytes | None]  # (connection number, request number) -> reply


def reply(status: int, body: bytes, extra: str = "") -> bytes:
    head = (
        f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n{extra}"
        "Connection: keep-alive\r\n\r\n"
    )
    return head.encode() + body


class FaultInjectingStubServer:
    """A raw asyncio HTTP/1.1 server whose replies a test scripts per connection and request."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[tuple[int, int]] = []
        self.connections = 0
        self.server: asyncio.Server | None = None
        self.url = ""

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        connection = self.connections
        number = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                number += 1
                self.requests.append((connection, number))
                data = self.handler(connection, number)
                if data is None:  # drop the connection without answering
                    break
                writer.write(data)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest_asyncio.fixture
async def stub() -> AsyncIterator[FaultInjectingStubServer]:
    server = FaultInjectingStubServer(lambda c, n: reply(200, b'{"ok": true}'))
    await server.start()
    yield server
    await server.stop()


async def test_a_pooled_connection_closed_by_the_server_is_retried_once(
    stub: FaultInjectingStubServer,
) -> None:
    # The second request on the first connection meets a closed connection, as a pooled
    # connection does when llama.cpp closed it while idle.
    stub.handler = lambda c, n: None if (c, n) == (1, 2) else reply(200, b'{"n": %d}' % n)
    client = HttpClient(stub.url)
    await client.open()
    try:
        assert await client.post_json("/x", {}) == {"n": 1}
        assert await client.post_json("/x", {}) == {"n": 1}  # answered on a fresh connection
    finally:
        await client.aclose()
    assert stub.requests == [(1, 1), (1, 2), (2, 1)]


async def test_a_second_drop_is_a_transport_error(stub: FaultInjectingStubServer) -> None:
    stub.handler = lambda c, n: None
    client = HttpClient(stub.url)
    await client.open()
    try:
        with pytest.raises(tv.TransportError):
            await client.post_json("/x", {}, max_retries=0)
    finally:
        await client.aclose()
    assert len(stub.requests) == 2  # the request, and its one replay on a fresh connection


async def client_for(stub: FaultInjectingStubServer, **settings: object) -> HttpClient:
    client = HttpClient(stub.url, **settings)  # type: ignore[arg-type]
    await client.open()
    return client


async def test_http_errors_are_typed_with_status_and_body(stub: FaultInjectingStubServer) -> None:
    stub.handler = lambda c, n: reply(503, b'{"error": "loading model"}')
    client = await client_for(stub)
    try:
        with pytest.raises(tv.ServerError, match="HTTP 503") as caught:
            await client.post_json("/x", {})
    finally:
        await client.aclose()
    assert caught.value.status == 503
    assert "loading model" in caught.value.body


async def test_redirects_are_not_followed(stub: FaultInjectingStubServer) -> None:
    stub.handler = lambda c, n: reply(302, b"", "Location: http://example.invalid/\r\n")
    client = await client_for(stub)
    try:
        with pytest.raises(tv.ServerError) as caught:
            await client.get_json("/x")
    finally:
        await client.aclose()
    assert caught.value.status == 302
    assert len(stub.requests) == 1


@pytest.mark.parametrize("body", [b"{not json", b'{"logprob": NaN}', b'{"logprob": Infinity}', b""])
async def test_invalid_json_is_a_protocol_error(
    stub: FaultInjectingStubServer, body: bytes
) -> None:
    stub.handler = lambda c, n: reply(200, body)
    client = await client_for(stub)
    try:
        with pytest.raises(tv.ProtocolError, match="not valid JSON"):
            await client.post_json("/x", {})
    finally:
        await client.aclose()


async def test_oversized_body_is_refused(stub: FaultInjectingStubServer) -> None:
    stub.handler = lambda c, n: reply(200, b"[" + b"0," * 5000 + b"0]")
    client = await client_for(stub, max_response_bytes=1000)
    try:
        with pytest.raises(tv.ProtocolError, match="exceeds the 1000-byte cap"):
            await client.post_json("/x", {})
    finally:
        await client.aclose()


async def test_api_key_is_sent_but_never_shown(stub: FaultInjectingStubServer) -> None:
    client = HttpClient(stub.url, api_key="sk-secret-123")
    assert "sk-secret-123" not in repr(client)
    session = tv.Session.llama_cpp(stub.url, api_key="sk-secret-123")
    assert "sk-secret-123" not in repr(session)


async def test_closed_client_cannot_reopen(stub: FaultInjectingStubServer) -> None:
    client = await client_for(stub)
    await client.aclose()
    with pytest.raises(tv.SessionStateError):
        await client.open()
    with pytest.raises(tv.SessionStateError):
        await client.get_json("/x")


FAST = RetryPolicy(max_retries=2, initial=0.01, maximum=0.05, jitter=0.0)


@pytest.mark.parametrize(
    ("failure", "retryable"),
    [
        (reply(503, b'{"error": "busy"}'), True),
        (reply(500, b"{}"), True),
        (reply(408, b"{}"), True),
        (reply(429, b"{}"), True),
        (reply(400, b'{"error": "bad"}'), False),
        (reply(404, b"{}"), False),
    ],
)
async def test_transient_statuses_are_retried_and_others_are_not(
    stub: FaultInjectingStubServer, failure: bytes, retryable: bool
) -> None:
    calls = {"n": 0}

    def handler(connection: int, number: int) -> bytes:
        calls["n"] += 1
        return failure if calls["n"] == 1 else reply(200, b'{"ok": 1}')

    stub.handler = handler
    client = await client_for(stub, retry=FAST)
    attempts = Attempts()
    try:
        if retryable:
            assert await client.post_json("/x", {}, attempts=attempts) == {"ok": 1}
        else:
            with pytest.raises(tv.ServerError):
                await client.post_json("/x", {}, attempts=attempts)
    finally:
        await client.aclose()
    assert attempts.count == (2 if retryable else 1)


async def test_retry_after_is_honoured(stub: FaultInjectingStubServer) -> None:
    calls = {"n": 0}

    def handler(connection: int, number: int) -> bytes:
        calls["n"] += 1
        if calls["n"] == 1:
            return reply(429, b"{}", "Retry-After: 1\r\n")
        return reply(200, b'{"ok": 1}')

    stub.handler = handler
    client = await client_for(stub, retry=FAST)
    attempts = Attempts()
    started = asyncio.get_running_loop().time()
    try:
        assert await client.post_json("/x", {}, attempts=attempts) == {"ok": 1}
    finally:
        await client.aclose()
    waited = asyncio.get_running_loop().time() - started
    assert attempts.count == 2
    assert 1.0 <= waited < 2.0  # the server's 1 s, not the policy's 10 ms backoff


async def test_retries_give_up_after_max_retries(stub: FaultInjectingStubServer) -> None:
    stub.handler = lambda c, n: reply(503, b"{}")
    client = await client_for(stub, retry=FAST)
    attempts = Attempts()
    try:
        with pytest.raises(tv.ServerError) as caught:
            await client.post_json("/x", {}, attempts=attempts)
        with pytest.raises(tv.ServerError):
            await client.post_json("/x", {}, max_retries=0)
    finally:
        await client.aclose()
    assert caught.value.status == 503
    assert attempts.count == 3  # 1 + max_retries
    assert len(stub.requests) == 4


async def test_a_dropped_connection_is_retried(stub: FaultInjectingStubServer) -> None:
    # Every request on connections 1 and 2 is dropped: the stale-connection replay and then
    # one retry are used up before connection 3 answers.
    stub.handler = lambda c, n: None if c <= 2 else reply(200, b'{"ok": 1}')
    client = await client_for(stub, retry=FAST)
    attempts = Attempts()
    try:
        assert await client.post_json("/x", {}, attempts=attempts) == {"ok": 1}
    finally:
        await client.aclose()
    assert attempts.count == 2


async def test_attempts_reach_the_answer_diagnostics(stub: FaultInjectingStubServer) -> None:
    from typevet_async._backends.llama_cpp import AsyncLlamaCpp
    from typevet_async._core.scoring import ScoringRequest, interpret_read

    top = [{"id": 10, "logprob": -1.0}, {"id": 11, "logprob": -2.0}]
    canned = json.dumps({"completion_probabilities": [{"top_logprobs": top}],
                         "tokens_evaluated": 7}).encode()  # fmt: skip
    calls = {"n": 0}

    def handler(connection: int, number: int) -> bytes:
        calls["n"] += 1
        return reply(503, b"{}") if calls["n"] == 1 else reply(200, canned)

    stub.handler = handler
    client = await client_for(stub, retry=FAST)
    backend = AsyncLlamaCpp(client, top_k=2)
    request = ScoringRequest("q", tv.Noul(instructions="x"), (), "P", ("0", "1"), (10, 11))
    try:
        read = await backend.read(request, 262_144)
        no_retry = None
        calls["n"] = 0
        with pytest.raises(tv.ServerError):
            no_retry = await backend.read(request, 262_144, max_retries=0)
    finally:
        await client.aclose()
    assert no_retry is None
    _, diagnostics = interpret_read(request, read)
    assert (read.reads, read.attempts, diagnostics.attempts) == (1, 2, 2)


async def test_the_api_key_never_leaks(
    stub: FaultInjectingStubServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Sent as a bearer header, and absent from reprs, logs, errors and their payloads."""
    secret = "sk-SECRET-4f1c"
    seen_headers: list[bytes] = []
    original = stub._serve

    async def capture(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen_headers.append(head)
        feed = asyncio.StreamReader()
        feed.feed_data(head + await reader.read(65536))
        feed.feed_eof()
        await original(feed, writer)

    stub.server.close()  # type: ignore[union-attr]
    await stub.server.wait_closed()  # type: ignore[union-attr]
    stub.server = await asyncio.start_server(capture, "127.0.0.1", 0)
    stub.url = f"http://127.0.0.1:{stub.server.sockets[0].getsockname()[1]}"
    outcomes = iter([reply(401, b'{"error": "bad key"}'), reply(500, b"{}"), reply(200, b"{oops")])
    stub.handler = lambda c, n: next(outcomes)
    caplog.set_level("DEBUG")
    errors: list[BaseException] = []
    session = tv.Session.llama_cpp(stub.url, api_key=secret, max_retries=0)
    async with session:
        for _ in range(3):
            try:
                await session.backend.http.post_json("/completion", {})  # type: ignore[attr-defined]
            except tv.TypevetError as error:
                errors.append(error)
    assert any(
        f"authorization: bearer {secret}".lower().encode() in h.lower() for h in seen_headers
    )
    assert len(errors) == 3
    shown = [repr(session), repr(session.backend), caplog.text]
    for error in errors:
        shown += [str(error), repr(error), repr(vars(error)), repr(error.__cause__)]
    assert all(secret not in text for text in shown)
