"""The HTTP shell against a fault-injecting stub server (named as such): a real llama.cpp
server cannot be made to drop a connection mid-request, or to redirect, on cue."""

from __future__ import annotations

import asyncio
import json
import math
import traceback
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiohttp.client_proto import ResponseHandler

import typevet_async as tv
from typevet_async._backends import llama_cpp_wire as backend_wire
from typevet_async._backends.http import SOCKET_READ_SIZE, Attempts, HttpClient
from typevet_async._backends.http_errors import parse_retry_after
from typevet_async._backends.llama_cpp import OnMissing
from typevet_async._backends.retrying import is_transient, retrying

from .stubs import (
    IDS,
    FaultInjectingStubServer,
    assert_takes_about,
    noul,
    reply,
    stopwatch,
)


@pytest_asyncio.fixture
async def stub() -> AsyncIterator[FaultInjectingStubServer]:
    server = FaultInjectingStubServer(lambda c, n: reply(200, b'{"ok": true}'))
    await server.start()
    yield server
    await server.stop()


@pytest.mark.asyncio
async def test_a_pooled_connection_closed_by_the_server_is_retried_once(
    stub: FaultInjectingStubServer,
) -> None:
    # The second request on the first connection meets a closed connection, as a pooled
    # connection does when llama.cpp closed it while idle.
    stub.handler = lambda c, n: None if (c, n) == (1, 2) else reply(200, b'{"n": %d}' % n)
    client = HttpClient(stub.url)
    await client.open()
    first, replayed = Attempts(), Attempts()
    try:
        assert await client.post("/x", {}, attempts=first) == b'{"n": 1}'
        # Answered on a fresh connection; both HTTP attempts are counted.
        assert await client.post("/x", {}, attempts=replayed) == b'{"n": 1}'
    finally:
        await client.aclose()
    assert stub.requests == [(1, 1), (1, 2), (2, 1)]
    assert (first.count, replayed.count) == (1, 2)


@pytest.mark.asyncio
async def test_a_second_drop_is_a_transport_error(stub: FaultInjectingStubServer) -> None:
    stub.handler = lambda c, n: None
    client = HttpClient(stub.url)
    await client.open()
    try:
        with pytest.raises(tv.TransportError):
            await client.post("/x", {}, max_retries=0)
    finally:
        await client.aclose()
    assert len(stub.requests) == 2  # the request, and its one replay on a fresh connection


async def client_for(
    stub: FaultInjectingStubServer, settings: tv.HttpSettings | None = None
) -> HttpClient:
    client = HttpClient(stub.url, settings)
    await client.open()
    return client


@pytest.mark.asyncio
async def test_http_errors_are_typed_with_status_and_body(stub: FaultInjectingStubServer) -> None:
    stub.handler = lambda c, n: reply(503, b'{"error": "loading model"}')
    client = await client_for(stub)
    try:
        with pytest.raises(tv.ServerError, match="HTTP 503") as caught:
            await client.post("/x", {})
    finally:
        await client.aclose()
    assert caught.value.status == 503
    assert "loading model" in caught.value.body


@pytest.mark.asyncio
async def test_redirects_are_not_followed(stub: FaultInjectingStubServer) -> None:
    stub.handler = lambda c, n: reply(302, b"", "Location: http://example.invalid/\r\n")
    client = await client_for(stub)
    try:
        with pytest.raises(tv.ServerError) as caught:
            await client.get("/x")
    finally:
        await client.aclose()
    assert caught.value.status == 302
    assert len(stub.requests) == 1


@pytest.mark.parametrize("body", [b"{not json", b'{"logprob": NaN}', b'{"logprob": Infinity}', b""])
@pytest.mark.asyncio
async def test_a_body_that_is_not_json_is_a_protocol_error_with_an_excerpt(
    stub: FaultInjectingStubServer, body: bytes
) -> None:
    # The client hands the bytes over as they came; the backend's decoder refuses them.
    stub.handler = lambda c, n: reply(200, body)
    backend = await llama_cpp(stub)
    try:
        assert await backend.http.post("/x", {}) == body
        with pytest.raises(tv.ProtocolError, match="not valid JSON") as caught:
            await backend.tokenize("0")
    finally:
        await backend.aclose()
    assert caught.value.payload == body.decode()


@pytest.mark.asyncio
async def test_oversized_body_is_refused(stub: FaultInjectingStubServer) -> None:
    stub.handler = lambda c, n: reply(200, b"[" + b"0," * 5000 + b"0]")
    client = await client_for(stub, tv.HttpSettings(max_response_bytes=1000))
    try:
        with pytest.raises(tv.ProtocolError, match="of 10003 bytes exceeds the 1000-byte cap"):
            await client.post("/x", {})
    finally:
        await client.aclose()


@pytest.mark.asyncio
async def test_sockets_are_read_at_most_64_kib_a_call_and_large_bodies_arrive_whole(
    stub: FaultInjectingStubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # asyncio's transport asks for 256 KiB a read, which glibc maps and unmaps every time.
    large = b"[" + b"1234567," * 40_000 + b"0]"  # 320 KB
    stub.handler = lambda c, n: reply(200, large)
    chunks: list[int] = []
    received = ResponseHandler.data_received

    def recording(self: ResponseHandler, data: bytes) -> None:
        chunks.append(len(data))
        received(self, data)

    monkeypatch.setattr(ResponseHandler, "data_received", recording)
    client = await client_for(stub)
    try:
        for _ in range(2):  # a fresh connection's first reply, then the pooled one's
            chunks.clear()
            assert await client.post("/x", {}) == large
            assert max(chunks) <= SOCKET_READ_SIZE == 64 * 1024
            assert len(chunks) >= len(large) // SOCKET_READ_SIZE
    finally:
        await client.aclose()
    assert stub.connections == 1


def chunked(body: bytes, size: int = 100) -> bytes:
    """A 200 reply without a Content-Length: the body in ``size``-byte chunks."""
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    encoded = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts) + b"0\r\n\r\n"
    head = b"HTTP/1.1 200 X\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"
    return head + encoded


@pytest.mark.asyncio
async def test_a_body_of_unknown_length_is_capped_as_it_streams(
    stub: FaultInjectingStubServer,
) -> None:
    small, large = b'{"ok": true}', b"[" + b"0," * 5000 + b"0]"
    stub.handler = lambda c, n: chunked(small if n == 1 else large)
    client = await client_for(stub, tv.HttpSettings(max_response_bytes=1000))
    try:
        assert await client.post("/x", {}) == small
        with pytest.raises(tv.ProtocolError, match="response exceeds the 1000-byte cap"):
            await client.post("/x", {})
    finally:
        await client.aclose()


@pytest.mark.asyncio
async def test_api_key_is_never_shown_in_a_repr(stub: FaultInjectingStubServer) -> None:
    settings = tv.HttpSettings(api_key="sk-secret-123")
    client = HttpClient(stub.url, settings)
    session = tv.Session.llama_cpp(stub.url, http=tv.HttpSettings(api_key="sk-secret-123"))
    backend = session.backend
    assert isinstance(backend, tv.AsyncLlamaCpp)
    assert backend.config.http.api_key == "sk-secret-123"
    shown = [repr(settings), repr(client), repr(session), repr(backend), repr(backend.config)]
    assert all("sk-secret-123" not in text for text in shown)


@pytest.mark.asyncio
async def test_closed_client_cannot_reopen(stub: FaultInjectingStubServer) -> None:
    client = await client_for(stub)
    await client.aclose()
    with pytest.raises(tv.SessionStateError):
        await client.open()
    with pytest.raises(tv.SessionStateError):
        await client.get("/x")


@pytest.mark.asyncio
async def test_a_client_needs_a_base_url_by_the_time_it_opens(
    stub: FaultInjectingStubServer,
) -> None:
    with pytest.raises(tv.SessionStateError, match="without a base URL"):
        await HttpClient(None).open()
    client = HttpClient(None)
    await client.open(stub.url)  # an embedded server's URL is known only once it started
    try:
        assert client.base_url == stub.url
        assert await client.get("/x") == b'{"ok": true}'
    finally:
        await client.aclose()


FAST = tv.RetryPolicy(max_retries=2, initial=0.01, maximum=0.05, jitter=0.0)


@pytest.mark.parametrize(
    ("failure", "retryable"),
    [
        (reply(503, b'{"error": "busy"}'), True),
        (reply(500, b"{}"), True),
        (reply(408, b"{}"), True),
        (reply(429, b"{}"), True),
        # 529: the hosted System One API's "overloaded"
        (reply(529, b'{"detail": {"error_type": "overloaded_error", "message": "busy"}}'), True),
        (reply(501, b"{}"), False),
        (reply(400, b'{"error": "bad"}'), False),
        (reply(404, b"{}"), False),
    ],
)
@pytest.mark.asyncio
async def test_transient_statuses_are_retried_and_others_are_not(
    stub: FaultInjectingStubServer, failure: bytes, retryable: bool
) -> None:
    calls = {"n": 0}

    def handler(connection: int, number: int) -> bytes:
        calls["n"] += 1
        return failure if calls["n"] == 1 else reply(200, b'{"ok": 1}')

    stub.handler = handler
    client = await client_for(stub, tv.HttpSettings(retry=FAST))
    attempts = Attempts()
    try:
        if retryable:
            assert await client.post("/x", {}, attempts=attempts) == b'{"ok": 1}'
        else:
            with pytest.raises(tv.ServerError):
                await client.post("/x", {}, attempts=attempts)
    finally:
        await client.aclose()
    assert attempts.count == (2 if retryable else 1)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("status", "headers", "expected"),
    [
        # The server's 1 s, not the policy's 10 ms backoff.
        (429, "Retry-After: 1\r\n", 1.0),
        (529, "retry-after-ms: 700\r\n", 0.7),
        (529, "retry-after-ms: 700\r\nRetry-After: 3\r\n", 0.7),  # the finer one wins
        (529, "retry-after-ms: soon\r\nRetry-After: 1\r\n", 1.0),  # not a number: Retry-After
    ],
)
async def test_retry_after_ms_is_honoured_before_retry_after(
    stub: FaultInjectingStubServer, status: int, headers: str, expected: float
) -> None:
    calls = {"n": 0}

    def handler(connection: int, number: int) -> bytes:
        calls["n"] += 1
        if calls["n"] == 1:
            return reply(status, b"{}", headers)
        return reply(200, b'{"ok": 1}')

    stub.handler = handler
    client = await client_for(stub, tv.HttpSettings(retry=FAST))
    attempts = Attempts()
    try:
        with stopwatch() as watch:
            assert await client.post("/x", {}, attempts=attempts) == b'{"ok": 1}'
    finally:
        await client.aclose()
    assert attempts.count == 2
    assert_takes_about(watch.elapsed, expected)


def test_retry_after_values_parse_as_the_headers_define_them() -> None:
    assert parse_retry_after(None, "250") == 0.25
    assert parse_retry_after("2", "0") == 0.0  # 0 ms is "now", not absent
    assert parse_retry_after("2", "-5") == 2.0  # a negative wait is not one
    assert parse_retry_after("2", "inf") == 2.0
    assert parse_retry_after("2", None) == 2.0
    assert parse_retry_after(None, None) is None


@pytest.mark.asyncio
async def test_retries_give_up_after_max_retries(stub: FaultInjectingStubServer) -> None:
    stub.handler = lambda c, n: reply(503, b"{}")
    client = await client_for(stub, tv.HttpSettings(retry=FAST))
    attempts = Attempts()
    try:
        with pytest.raises(tv.ServerError) as caught:
            await client.post("/x", {}, attempts=attempts)
        with pytest.raises(tv.ServerError):
            await client.post("/x", {}, max_retries=0)
    finally:
        await client.aclose()
    assert caught.value.status == 503
    assert attempts.count == 3  # 1 + max_retries
    assert len(stub.requests) == 4


@pytest.mark.asyncio
async def test_a_failed_first_attempt_handed_to_retrying_counts_as_its_first() -> None:
    # The client makes its first attempt itself and hands the failure to `retrying`: tenacity's
    # stop rule must count it, so `retries` more attempts are made, not `retries + 1`.
    calls: list[int] = []
    waits: list[float] = []

    async def attempt() -> str:
        calls.append(len(calls))
        raise tv.TransportError("down")

    async def no_sleep(seconds: float) -> None:
        waits.append(seconds)

    with pytest.raises(tv.TransportError, match="down"):
        await retrying(
            attempt,
            retries=2,
            retryable=is_transient,
            wait=lambda state: 0.5,
            sleep=no_sleep,
            first=tv.TransportError("first"),
        )
    assert calls == [0, 1]  # 1 (handed in) + 2 retries
    assert waits == [0.5, 0.5]  # a wait before each retry, the first one's included

    async def answer() -> str:
        calls.append(len(calls))
        return "ok"

    calls.clear()
    assert (
        await retrying(
            answer, retries=2, retryable=is_transient, wait=lambda state: 0.0, sleep=no_sleep
        )
        == "ok"
    )
    assert calls == [0]  # no first failure: one direct attempt, tenacity never entered


@pytest.mark.asyncio
async def test_a_dropped_connection_is_retried(stub: FaultInjectingStubServer) -> None:
    # Every request on connections 1 and 2 is dropped: the stale-connection replay and then
    # one retry are used up before connection 3 answers. Every HTTP attempt is counted.
    stub.handler = lambda c, n: None if c <= 2 else reply(200, b'{"ok": 1}')
    client = await client_for(stub, tv.HttpSettings(retry=FAST))
    attempts = Attempts()
    try:
        assert await client.post("/x", {}, attempts=attempts) == b'{"ok": 1}'
    finally:
        await client.aclose()
    assert attempts.count == 3
    assert stub.requests == [(1, 1), (2, 1), (3, 1)]


PROBE = tv.Probe(tv.TemplateFamily.GEMMA3, "rendered", IDS, 262_144)
REQUEST = tv.ScoringRequest("q", noul(), (), "P", ("0", "1"), (10, 11))


def completion(top: list[tuple[int, float]], n_probs: int) -> bytes:
    return json.dumps(
        {
            "completion_probabilities": [
                {"top_logprobs": [{"id": i, "logprob": lp} for i, lp in top]}
            ],
            "generation_settings": {"n_probs": n_probs},
            "tokens_evaluated": 7,
        }
    ).encode()


async def llama_cpp(
    stub: FaultInjectingStubServer, *, top_k: int | None = None, on_missing: OnMissing = "exact"
) -> tv.AsyncLlamaCpp:
    http = tv.HttpSettings(retry=FAST)
    config = tv.LlamaCppConfig(base_url=stub.url, top_k=top_k, on_missing=on_missing, http=http)
    backend = tv.AsyncLlamaCpp(config)
    await backend.open()
    return backend


@pytest.mark.asyncio
async def test_attempts_reach_the_answer_diagnostics(stub: FaultInjectingStubServer) -> None:
    from typevet_async._core.reading.interpreting import interpret_read

    canned = completion([(10, -1.0), (11, -2.0)], 2)
    calls = {"n": 0}

    def handler(connection: int, number: int) -> bytes:
        calls["n"] += 1
        return reply(503, b"{}") if calls["n"] == 1 else reply(200, canned)

    stub.handler = handler
    backend = await llama_cpp(stub, top_k=2)
    try:
        read = await backend.read(REQUEST, PROBE, max_retries=tv.UNSET)
        calls["n"] = 0
        with pytest.raises(tv.ServerError, match="HTTP 503"):
            await backend.read(REQUEST, PROBE, max_retries=0)
    finally:
        await backend.aclose()
    assert calls["n"] == 1  # max_retries=0: the 503 was the one attempt
    _, diagnostics = interpret_read(REQUEST, read)
    assert (read.reads, read.attempts, diagnostics.attempts) == (1, 2, 2)


@pytest.mark.asyncio
async def test_the_stale_connection_replay_counts_in_the_answer_attempts(
    stub: FaultInjectingStubServer,
) -> None:
    from typevet_async._core.reading.interpreting import interpret_read

    # The second read meets its pooled connection closed and is replayed on a fresh one.
    canned = completion([(10, -1.0), (11, -2.0)], 2)
    stub.handler = lambda c, n: None if (c, n) == (1, 2) else reply(200, canned)
    backend = await llama_cpp(stub, top_k=2)
    try:
        first = await backend.read(REQUEST, PROBE, max_retries=0)
        replayed = await backend.read(REQUEST, PROBE, max_retries=0)
    finally:
        await backend.aclose()
    assert stub.requests == [(1, 1), (1, 2), (2, 1)]
    assert (first.attempts, replayed.reads, replayed.attempts) == (1, 1, 2)
    assert interpret_read(REQUEST, replayed)[1].attempts == 2


@pytest.mark.asyncio
async def test_a_candidate_missing_from_a_whole_vocabulary_read_is_an_error(
    stub: FaultInjectingStubServer,
) -> None:
    # A two-token vocabulary: the first read of K=2 is the whole vocabulary. Its entries are
    # distinct ids below 2, so candidates 10 and 11 (outside it) cannot be in it.
    stub.handler = lambda c, n: reply(200, completion([(0, -0.5), (1, -1.0)], 2))
    backend = await llama_cpp(stub)
    probe = tv.Probe(tv.TemplateFamily.GEMMA3, "rendered", IDS, 2)
    try:
        with pytest.raises(tv.InvalidLogprobsError, match=r"\[10, 11\] are missing"):
            await backend.read(REQUEST, probe, max_retries=tv.UNSET)
    finally:
        await backend.aclose()
    assert len(stub.requests) == 1


@pytest.mark.asyncio
async def test_an_entry_outside_the_vocabulary_is_refused(stub: FaultInjectingStubServer) -> None:
    stub.handler = lambda c, n: reply(200, completion([(10, -0.5), (262_144, -1.0)], 2))
    backend = await llama_cpp(stub, top_k=2)
    try:
        with pytest.raises(tv.InvalidLogprobsError, match="outside the vocabulary of 262144"):
            await backend.read(REQUEST, PROBE, max_retries=tv.UNSET)
    finally:
        await backend.aclose()


#: A Jev-layout request: options A (10, " A" 20) and B (11, " B" 21).
JEV_REQUEST = tv.ScoringRequest("q", noul(), (), "P", ("A", "B"), (10, 11), ((20,), (21,)))


@pytest.mark.asyncio
async def test_clamp_and_error_count_an_option_missing_only_when_none_of_its_tokens_is_read(
    stub: FaultInjectingStubServer,
) -> None:
    # B's control (11) is outside the top 3, its space variant (21) is in it.
    variant_only = completion([(10, -0.5), (21, -1.5), (7, -3.0)], 3)
    stub.handler = lambda c, n: reply(200, variant_only)
    for policy in ("clamp", "error"):
        backend = await llama_cpp(stub, top_k=3, on_missing=policy)
        try:
            read = await backend.read(JEV_REQUEST, PROBE, max_retries=tv.UNSET)
        finally:
            await backend.aclose()
        assert (read.token_ids, read.logprobs, read.truncated) == ((10, 21), (-0.5, -1.5), False)
    # Neither of B's tokens: clamp fills B's control with the floor, error refuses.
    neither = completion([(10, -0.5), (20, -1.5), (7, -3.0)], 3)
    stub.handler = lambda c, n: reply(200, neither)
    backend = await llama_cpp(stub, top_k=3, on_missing="clamp")
    try:
        read = await backend.read(JEV_REQUEST, PROBE, max_retries=tv.UNSET)
    finally:
        await backend.aclose()
    assert (read.token_ids, read.logprobs, read.truncated) == (
        (10, 20, 11),
        (-0.5, -1.5, -3.0),
        True,
    )
    backend = await llama_cpp(stub, top_k=3, on_missing="error")
    try:
        with pytest.raises(tv.CandidateMissingError, match="outside the top 3") as caught:
            await backend.read(JEV_REQUEST, PROBE, max_retries=tv.UNSET)
    finally:
        await backend.aclose()
    assert caught.value.missing == (11, 21)


@pytest.mark.asyncio
async def test_the_model_pin_is_checked_at_the_probe_before_anything_else(
    stub: FaultInjectingStubServer,
) -> None:
    models = {"data": [{"id": "gemma", "aliases": ["g"], "meta": {"n_vocab": 262_144}}]}
    stub.handler = lambda c, n: reply(200, json.dumps(models).encode())
    async with tv.Session.llama_cpp(stub.url, model="other") as session:
        with pytest.raises(tv.ConfigurationError, match="pinned to model 'other'"):
            await session.judge("s", {"q": noul()})
    assert len(stub.requests) == 1  # GET /v1/models, nothing after it
    assert stub.seen_heads[0].startswith(b"GET /v1/models ")


@pytest.mark.asyncio
async def test_waiting_for_a_pooled_connection_does_not_count_against_request_timeout(
    stub: FaultInjectingStubServer,
) -> None:
    # 20 requests on 2 connections, each answered 0.1 s after it arrives: together they take
    # at least 1.0 s (twice the timeout), each well under the 0.5 s timeout once it is sent.
    stub.delay = 0.1
    settings = tv.HttpSettings(
        max_connections=2, request_timeout=0.5, retry=tv.RetryPolicy(max_retries=0)
    )
    client = await client_for(stub, settings)
    try:
        with stopwatch() as watch:
            results = await asyncio.gather(*(client.post("/x", {}) for _ in range(20)))
    finally:
        await client.aclose()
    assert results == [b'{"ok": true}'] * 20
    assert stub.connections <= 2
    assert watch.elapsed >= 10 * stub.delay


@pytest.mark.asyncio
async def test_a_request_slower_than_request_timeout_times_out(
    stub: FaultInjectingStubServer,
) -> None:
    stub.delay = 10.0
    settings = tv.HttpSettings(request_timeout=0.2, retry=tv.RetryPolicy(max_retries=0))
    client = await client_for(stub, settings)
    try:
        with stopwatch() as watch, pytest.raises(tv.RequestTimeoutError, match="timed out"):
            await client.post("/x", {})
    finally:
        await client.aclose()
    assert_takes_about(watch.elapsed, 0.2)
    assert isinstance(tv.RequestTimeoutError("x"), TimeoutError)


@pytest.mark.asyncio
async def test_the_api_key_never_leaks(
    stub: FaultInjectingStubServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Sent as a bearer header, and absent from reprs, logs, errors and their payloads."""
    secret = "sk-SECRET-4f1c"
    outcomes = iter([reply(401, b'{"error": "bad key"}'), reply(500, b"{}"), reply(200, b"{oops")])
    stub.handler = lambda c, n: next(outcomes)
    caplog.set_level("DEBUG")
    errors: list[tv.TypevetError] = []
    session = tv.Session.llama_cpp(
        stub.url,
        http=tv.HttpSettings(api_key=secret, retry=tv.RetryPolicy(max_retries=0)),
    )
    backend = session.backend
    assert isinstance(backend, tv.AsyncLlamaCpp)
    async with session:
        for _ in range(3):
            try:
                raw = await backend.http.post("/completion", {})
                backend_wire.decode_completion(raw, 1)
            except tv.TypevetError as error:
                errors.append(error)
    assert len(stub.seen_heads) == 3
    bearer = f"authorization: bearer {secret}".lower().encode()
    assert all(bearer in head.lower() for head in stub.seen_heads)
    assert [type(e) for e in errors] == [tv.ServerError, tv.ServerError, tv.ProtocolError]
    shown = [repr(session), repr(backend), repr(backend.http), caplog.text]
    for failure in errors:
        shown += [str(failure), repr(failure), repr(vars(failure)), repr(failure.__cause__)]
    assert all(secret not in text for text in shown)


class ProbedLlamaCpp(tv.AsyncLlamaCpp):
    """The real llama.cpp backend whose probe is known in advance (`PROBE`), so that a session
    sends only scoring reads to the stub."""

    async def probe(self) -> tv.Probe:
        return PROBE


class ProbedVllm(tv.AsyncVllm):
    async def probe(self) -> tv.Probe:
        return PROBE


def malformed_completion(**fields: object) -> bytes:
    payload = json.loads(completion([(1000, -1.0), (1001, -2.0)], 2))
    payload.update(fields)
    return json.dumps(payload).encode()


@pytest.mark.parametrize(
    ("body", "error", "message"),
    [
        (malformed_completion(generation_settings="n_probs"), tv.ProtocolError,
         "generation_settings"),
        (malformed_completion(timings=[1]), tv.ProtocolError, "timings"),
        (malformed_completion(tokens_evaluated="abc"), tv.ProtocolError, "tokens_evaluated"),
        (completion([(1000, -1.0), (1001.9, -2.0)], 2), tv.ProtocolError, "got `float`"),
        (completion([(1000, -1.0), (1001, 0.5)], 2), tv.InvalidLogprobsError, "positive"),
        (b'{"completion_probabilities": [', tv.ProtocolError, "not valid JSON"),
        # Each logprob is valid, but together the candidates' probabilities sum to 1.86.
        (completion([(1000, math.log(0.93)), (1001, math.log(0.93))], 2),
         tv.InvalidLogprobsError, "sum to 1.86"),
    ],
)  # fmt: skip
@pytest.mark.asyncio
async def test_a_malformed_read_reply_names_its_question_through_a_session(
    stub: FaultInjectingStubServer, body: bytes, error: type[tv.TypevetError], message: str
) -> None:
    stub.handler = lambda c, n: reply(200, body)
    http = tv.HttpSettings(retry=FAST)
    backend = ProbedLlamaCpp(tv.LlamaCppConfig(base_url=stub.url, top_k=2, http=http))
    # Lettered: the replies carry the letters' ids (1000, 1001), not the words'.
    settings = tv.SessionSettings(prefix_reuse="off", noul_controls="letters")
    async with tv.Session(backend, settings) as session:
        with pytest.raises(error, match=message) as caught:
            await session.judge("state", {"ticket-7": noul()})
    assert type(caught.value) is error
    assert caught.value.question_id == "ticket-7"
    assert "question 'ticket-7'" in str(caught.value)
    payload = getattr(caught.value, "payload", None)
    assert payload is None or (isinstance(payload, str) and len(payload) <= 2048)
    assert len(stub.requests) == 1  # a malformed reply is not retried


@pytest.mark.parametrize(
    ("usage", "message"),
    [("40", "usage"), ([40], "usage"), ({"prompt_tokens": "40"}, "prompt_tokens")],
)
@pytest.mark.asyncio
async def test_a_malformed_vllm_read_reply_names_its_question_through_a_session(
    stub: FaultInjectingStubServer, usage: object, message: str
) -> None:
    top = [{"token": f"token_id:{i}", "logprob": -1.0 - i / 1000} for i in (1000, 1001)]
    position = {"token": "token_id:1000", "logprob": -1.0, "top_logprobs": top}
    body = {"choices": [{"logprobs": {"content": [position]}}], "usage": usage}
    stub.handler = lambda c, n: reply(200, json.dumps(body).encode())
    backend = ProbedVllm(tv.VllmConfig(base_url=stub.url, model="m"))
    async with tv.Session(backend) as session:
        with pytest.raises(tv.ProtocolError, match=message) as caught:
            await session.judge("state", {"q": noul()})
    assert caught.value.question_id == "q"


# -- a reply aiohttp cannot parse is a ProtocolError, never a status the server never sent ---


class HeadCuttingStubServer:
    """A raw stub server that answers every request with ``data`` and then closes the
    connection: a header block cut off mid-way (no real server can be made to do it on cue)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.requests = 0
        self.url = ""
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> HeadCuttingStubServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            self.requests += 1
            writer.write(self.data)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


OK_HEAD = b"HTTP/1.1 200 OK\r\n"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (OK_HEAD + b"Content-Length: 2\r\nnot a header line\r\n\r\n{}", "Invalid header token"),
        (OK_HEAD + b"Content-Length: abc\r\n\r\n{}", "Invalid character in Content-Length"),
        (OK_HEAD + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}", "Duplicate Content-Length"),
        (OK_HEAD + b"X-Long: " + b"a" * 9000 + b"\r\nContent-Length: 2\r\n\r\n{}",
         "Got more than 8190 bytes"),
        (OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
         "Invalid character in chunk size"),
        (b"HTTP/1.1 2x0 OK\r\nContent-Length: 2\r\n\r\n{}", "Bad status line"),
        (OK_HEAD + b"Content-Encoding: gzip\r\nContent-Length: 4\r\n\r\nabcd",
         "body could not be decoded"),
        (OK_HEAD + b"Content-Length: 2\r\nX-Half", "header block was cut off after 'HTTP/1.1 200'"),
    ],
)  # fmt: skip
@pytest.mark.asyncio
async def test_a_reply_that_is_not_valid_http_is_a_protocol_error_naming_the_fault(
    data: bytes, message: str
) -> None:
    # aiohttp reports most of these as ClientResponseError(status=400): that 400 is its
    # parser's, not the server's, so it must never become a ServerError("HTTP 400").
    settings = tv.HttpSettings(api_key="sk-header-block-0001", retry=FAST)
    async with HeadCuttingStubServer(data) as stub:
        client = HttpClient(stub.url, settings)
        await client.open()
        try:
            with pytest.raises(tv.ProtocolError, match=message) as caught:
                await client.post("/completion", {})
        finally:
            await client.aclose()
    assert type(caught.value) is tv.ProtocolError
    assert stub.requests == 1  # neither retried nor replayed as a stale connection
    # Nothing chained: aiohttp's error carries the request headers, the bearer token among them.
    assert caught.value.__cause__ is None
    assert caught.value.__context__ is None
    assert "sk-header-block-0001" not in "".join(traceback.format_exception(caught.value))


@pytest.mark.asyncio
async def test_a_body_cut_off_is_still_a_transient_transport_error() -> None:
    async with HeadCuttingStubServer(OK_HEAD + b"Content-Length: 20\r\n\r\n{}") as stub:
        client = HttpClient(stub.url, tv.HttpSettings(retry=FAST))
        await client.open()
        try:
            with pytest.raises(tv.TransportError, match="response body cut off") as caught:
                await client.post("/x", {})
        finally:
            await client.aclose()
    assert stub.requests == 3  # retried: the next attempt may get the whole body
    assert caught.value.__cause__ is None
    assert caught.value.__context__ is None


@pytest.mark.asyncio
async def test_no_client_error_chains_an_aiohttp_error(stub: FaultInjectingStubServer) -> None:
    # A stale-connection replay that fails again, a timeout, a refused connection: each is
    # raised outside the except block that mapped it, so nothing aiohttp raised is chained.
    stub.handler = lambda c, n: None
    settings = tv.HttpSettings(request_timeout=0.2, retry=FAST, api_key="sk-chain-0002")
    client = await client_for(stub, settings)
    refused = HttpClient("http://127.0.0.1:9", settings)  # the discard port: nothing listens
    await refused.open()
    try:
        with pytest.raises(tv.TransportError) as dropped:
            await client.post("/x", {})
        stub.delay, stub.handler = 5.0, lambda c, n: reply(200, b"{}")
        with pytest.raises(tv.RequestTimeoutError, match=r"after 0\.2 s") as late:
            await client.post("/x", {})
        with pytest.raises(tv.TransportError, match="Cannot connect") as unreachable:
            await refused.get("/x")
    finally:
        await client.aclose()
        await refused.aclose()
    for error in (dropped.value, late.value, unreachable.value):
        assert error.__cause__ is None, repr(error.__cause__)
        assert error.__context__ is None, repr(error.__context__)


# -- HttpSettings refuses what it could not send, at construction -----------------------------


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("sk-abc\n", "ends with whitespace"),
        (" sk-abc", "starts or ends with whitespace"),
        ("sk-abc\r\n", "ends with whitespace"),
        ("sk ab c", "visible ASCII"),
        ("sk-\x00abc", "visible ASCII"),
        ("sk-\x7fabc", "visible ASCII"),
        ("sk-clé", "visible ASCII"),
        ("sk-鍵", "visible ASCII"),
        ("", "empty"),
        (b"sk-bytes", "must be a string"),
        (42, "must be a string"),
    ],
)
def test_an_api_key_that_cannot_be_sent_is_refused_when_built(key: object, message: str) -> None:
    with pytest.raises(tv.ConfigurationError, match=message) as caught:
        tv.HttpSettings(api_key=key)  # type: ignore[arg-type]
    assert "api_key" in str(caught.value)
    if isinstance(key, str) and key.strip():
        assert key.strip() not in str(caught.value)  # the key itself is never shown
    with pytest.raises(tv.ConfigurationError, match="api_key"):
        tv.Session.llama_cpp("http://127.0.0.1:1", http=tv.HttpSettings(api_key=key))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("request_timeout", "x"),
        ("request_timeout", float("nan")),
        ("request_timeout", -1.0),
        ("request_timeout", float("inf")),
        ("request_timeout", True),
        ("max_connections", 2.5),
        ("keepalive", "2"),
        ("max_response_bytes", 0),
        ("retry", "x"),
        ("trace_configs", 5),
        ("trace_configs", ["not a TraceConfig"]),
        ("verify_tls", "yes"),
        ("time_slice", 0),
        ("time_slice", -0.001),
        ("time_slice", float("inf")),
        ("time_slice", "1ms"),
        ("time_slice", True),
    ],
)
def test_every_http_setting_is_a_typed_error_naming_it(field: str, value: object) -> None:
    with pytest.raises(tv.ConfigurationError, match=field):
        tv.HttpSettings(**{field: value})


def test_url_credentials_and_an_api_key_together_are_refused_when_built() -> None:
    # aiohttp would refuse them at the first request with a raw ValueError: both are the
    # Authorization header.
    settings = tv.HttpSettings(api_key="sk-both-0003")
    with pytest.raises(tv.ConfigurationError, match="give one of them") as caught:
        HttpClient("http://user:pw-both@127.0.0.1:1", settings)
    assert "pw-both" not in str(caught.value)
    with pytest.raises(tv.ConfigurationError, match="not a valid URL"):
        HttpClient("http://[::1", settings)


# -- a timed-out generation fails once, clearly -------------------------------------------------


GENERATION = tv.GenerationRequest("colour?", {"type": "object"}, (), 512)


@pytest.mark.parametrize("backend", ["llama_cpp", "vllm"])
@pytest.mark.asyncio
async def test_a_generation_that_outlives_request_timeout_is_not_retried(
    stub: FaultInjectingStubServer, backend: str
) -> None:
    stub.delay = 30.0  # never answers a chat completion in time
    http = tv.HttpSettings(request_timeout=0.3, retry=FAST)
    probed: tv.Backend = (
        ProbedLlamaCpp(tv.LlamaCppConfig(base_url=stub.url, http=http))
        if backend == "llama_cpp"
        else ProbedVllm(tv.VllmConfig(base_url=stub.url, model="m", http=http))
    )
    async with tv.Session(probed) as session:
        with stopwatch() as watch, pytest.raises(tv.RequestTimeoutError) as caught:
            await session.generate("colour?", schema={"type": "object"})
    assert len(stub.requests) == 1  # sent once: a retry would start from scratch
    assert_takes_about(watch.elapsed, 0.3)
    message = str(caught.value)
    assert "the generation outlived request_timeout and was not retried" in message
    assert "after 0.3 s (request_timeout)" in message
    assert "http=tv.HttpSettings(request_timeout=...) (or TYPEVET_REQUEST_TIMEOUT" in message
    assert "max_tokens= (512 here)" in message
    assert caught.value.prompt_index == 0


@pytest.mark.asyncio
async def test_a_scoring_read_that_times_out_is_still_retried(
    stub: FaultInjectingStubServer,
) -> None:
    stub.delay = 30.0
    http = tv.HttpSettings(request_timeout=0.2, retry=FAST)
    backend = tv.AsyncLlamaCpp(tv.LlamaCppConfig(base_url=stub.url, top_k=2, http=http))
    await backend.open()
    try:
        with pytest.raises(tv.RequestTimeoutError, match=r"timed out after 0\.2 s"):
            await backend.read(REQUEST, PROBE, max_retries=2)
        # Other transient failures of a generation are retried as before.
        stub.delay = 0.0
        outcomes = iter([reply(503, b"{}"), reply(200, json.dumps(CHAT).encode())])
        stub.handler = lambda c, n: next(outcomes)
        output = await backend.generate(GENERATION, max_retries=2)
    finally:
        await backend.aclose()
    assert len(stub.requests) == 3 + 2  # the read: 1 + max_retries; the generation: 2
    assert output.content == '{"n": 1}'


CHAT = {
    "choices": [{"finish_reason": "stop", "message": {"content": '{"n": 1}'}}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 5},
}
