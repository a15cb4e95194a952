"""The official System One client (``typesafe-sdk``, sync and async) against ``typevet-async
serve``'s gateway, run in-process over the real llama.cpp server (Gemma 3 270M) and over the
real vLLM server (the same model); and the real command (``typevet-async serve`` in a child
process) stopped by a real SIGTERM while requests are in flight."""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import typesafe_sdk as ts
from typesafe_sdk._schemas import models as ts_models

import typevet_async as tv
from typevet_async._apps.gateway import GatewayConfig
from typevet_async._core.wires.system_one import questions_from_system_one, request_from_system_one

from .helpers import PNG_HEADER, ready_gateway
from .servers import VLLM_MODEL_ID

pytestmark = pytest.mark.live

KEY = "live-gateway-key"
STATE = {"subject": "Duplicate charge", "message": "I was charged twice, please refund me."}
QUESTIONS: dict[str, Any] = {
    "refund": {"type": "noul", "instructions": "Is a refund requested?"},
    "route": {
        "type": "choice",
        "instructions": "Which team should handle it?",
        "criteria": {"billing": "money matters", "shipping": None, "technical": None},
    },
    "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["low", "high"]},
}


def running_gateway(session: tv.Session) -> contextlib.AbstractAsyncContextManager[str]:
    """The gateway over ``session``, in-process on a free port, probed: its URL."""
    return ready_gateway(session, GatewayConfig(keys=(KEY,)))


@pytest_asyncio.fixture
async def gateway_url(gemma3_url: str) -> AsyncIterator[str]:
    async with running_gateway(tv.Session.llama_cpp(gemma3_url, reproducible=True)) as url:
        yield url


async def direct_answers(gemma3_url: str) -> dict[str, Any]:
    call = request_from_system_one({"model": "any", "state": STATE, "questions": QUESTIONS})
    async with tv.Session.llama_cpp(gemma3_url, reproducible=True) as session:
        judgment = await session.judge(call.state, call.questions)
    return dict(judgment.answers)


def assert_same(response: ts.SystemOneResponse, direct: dict[str, Any]) -> None:
    route = response.choices["route"]
    assert route.choice == direct["route"].choice
    pairs = [
        (response.nouls["refund"].noul, direct["refund"].noul),
        (response.scores["urgency"].score, direct["urgency"].score),
        *((route.probabilities[label], p) for label, p in direct["route"].probabilities.items()),
    ]
    gap = max(abs(got - expected) for got, expected in pairs)
    print(f"gateway vs direct session.judge: largest gap {gap:.1e}")
    assert gap <= 1e-6


NO_RETRY = ts.RetryPolicy(max_retries=0)
#: The official client's default is 10 s: three reproducible reads (one at a time, no prompt
#: cache) outlived it once on a loaded machine.
CLIENT_TIMEOUT = 120.0


@pytest.mark.asyncio
async def test_the_async_client_gets_the_direct_answers(gateway_url: str, gemma3_url: str) -> None:
    direct = await direct_answers(gemma3_url)
    async with ts.AsyncTypeSafeClient(
        api_key=KEY, base_url=gateway_url, retry=NO_RETRY, timeout=CLIENT_TIMEOUT
    ) as c:
        response = await c.system_one(state=STATE, questions=QUESTIONS, model="gemma-3-270m")
        listed = await c.models.list()
    assert_same(response, direct)
    assert [m.name for m in listed.models]


@pytest.mark.asyncio
async def test_the_sync_client_gets_the_direct_answers(gateway_url: str, gemma3_url: str) -> None:
    direct = await direct_answers(gemma3_url)

    def ask() -> ts.SystemOneResponse:
        with ts.TypeSafeClient(
            api_key=KEY, base_url=gateway_url, retry=NO_RETRY, timeout=CLIENT_TIMEOUT
        ) as client:
            return client.system_one(state=STATE, questions=QUESTIONS, model="gemma-3-270m")

    assert_same(await asyncio.to_thread(ask), direct)


#: The official client's retries, as a user sending queued load through the gateway sets them:
#: its default (2 retries within 30 s in all) never retries a 504, since the gateway's
#: deadline (60 s) is past that budget; this one retries the gateway's every retryable answer
#: (429 when a request would not be judged within the deadline, 504 past it) however late it
#: comes.
QUEUED_LOAD_RETRY = ts.RetryPolicy(max_retries=10, timeout=None)


def answered_by_status(metrics: str, route: str) -> dict[str, int]:
    """The gateway's answers on ``route`` by status, from its Prometheus exposition."""
    pattern = re.compile(
        r'^typevet_gateway_requests_total\{route="' + re.escape(route) + r'",status="(\d+)"\} '
        r"([0-9.e+]+)$",
        re.MULTILINE,
    )
    return {status: int(float(count)) for status, count in pattern.findall(metrics)}


#: Three times the concurrency: every request but the first 32 waits for another's place.
LOAD_REQUESTS = 96


@pytest.mark.asyncio
@pytest.mark.timeout(900)  # 96 judgments at 0.3 to 5 a second, and the retries of 504s
async def test_the_official_client_at_concurrency_32_loses_nothing_at_the_defaults(
    gemma3_url: str,
) -> None:
    # At the old defaults (8 in flight + a queue of 16, Retry-After a constant 1 s) 15 of 200
    # such requests failed with TypeSafeRateLimitError. Later the test failed once under load:
    # requests that waited past the 60 s deadline got a 504, which the client's default retry
    # budget (30 s in all) never retries. Measured on this machine while others' tests ran: 57
    # of 200 lost so, at 0.8 requests/s (each read escalated to the top 4,096), and 200
    # requests with retries outran the 300 s test timeout. What a user needs holds at any
    # speed: a client that retries its retryable answers (a 429 when the gateway measures that
    # a request would not be judged within the deadline, told when to come back; a 504 when
    # a judgment took longer than measured) loses none, and each is answered once. How fast
    # it goes is the benchmark's (benchmarks/gateway/bench_gateway_load.py).
    session = tv.Session.llama_cpp(gemma3_url)
    questions = {"refund": QUESTIONS["refund"]}
    async with (
        ready_gateway(session, GatewayConfig(keys=(KEY,))) as url,
        ts.AsyncTypeSafeClient(
            api_key=KEY, base_url=url, retry=QUEUED_LOAD_RETRY, timeout=CLIENT_TIMEOUT
        ) as client,
    ):
        gate = asyncio.Semaphore(32)

        async def one(n: int) -> str:
            async with gate:
                try:
                    state = {**STATE, "n": n}
                    await client.system_one(state=state, questions=questions)
                except ts.TypeSafeError as error:
                    return type(error).__name__
                return "ok"

        outcomes = await asyncio.gather(*(one(n) for n in range(LOAD_REQUESTS)))
        async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as scraped:
            statuses = answered_by_status(await scraped.text(), "/v1/systemone")
    print(f"the gateway's answers by status: {statuses}")
    failures = [outcome for outcome in outcomes if outcome != "ok"]
    assert failures == []
    assert statuses.get("200") == LOAD_REQUESTS  # each answered once
    assert set(statuses) <= {"200", "429", "504"}  # each retried


@pytest.mark.asyncio
async def test_a_wrong_key_is_the_clients_auth_error(gateway_url: str) -> None:
    async with ts.AsyncTypeSafeClient(
        api_key="wrong", base_url=gateway_url, retry=NO_RETRY, timeout=CLIENT_TIMEOUT
    ) as client:
        with pytest.raises(ts.TypeSafeAuthenticationError) as raised:
            await client.system_one(state=STATE, questions=QUESTIONS)
    assert raised.value.status == 401


@pytest.mark.asyncio
async def test_bad_questions_are_the_clients_validation_error(gateway_url: str) -> None:
    bad = {"q": {"type": "score", "instructions": "How?", "criteria": ["only one"]}}

    def ask() -> None:
        with ts.TypeSafeClient(
            api_key=KEY, base_url=gateway_url, retry=NO_RETRY, timeout=CLIENT_TIMEOUT
        ) as client:
            client.system_one(state=STATE, questions=bad)

    with pytest.raises(ts.TypeSafeUnprocessableEntityError) as raised:
        await asyncio.to_thread(ask)
    assert raised.value.status == 422


@pytest.mark.asyncio
async def test_the_clients_zstd_bodies_are_read(gateway_url: str) -> None:
    from typesafe_sdk._core.compression import MIN_COMPRESSED_BODY_LENGTH, resolve_compression

    assert resolve_compression(None) == "zstd"  # backports.zstd is installed: it compresses
    state = {**STATE, "history": "Earlier: asked about delivery. " * 40}
    assert len(str(state)) > MIN_COMPRESSED_BODY_LENGTH
    async with ts.AsyncTypeSafeClient(
        api_key=KEY, base_url=gateway_url, retry=NO_RETRY, timeout=CLIENT_TIMEOUT
    ) as c:
        response = await c.system_one(state=state, questions=QUESTIONS)
    assert 0 <= response.nouls["refund"].noul <= 1


# -- graceful shutdown: the real command, a real SIGTERM --------------------------------------

#: Lines of a long state (about 450 prompt tokens: about 1.5 s a read on 2 quiet cores, read
#: one at a time; 8 s on a loaded machine).
COMPLAINT_LINES = 25
DRAIN_QUESTIONS = {"refund": {"type": "noul", "instructions": "Is a refund requested?"}}
IN_FLIGHT = 4
#: The drain ends well inside it (4 reads of about 1.5 s each, one at a time; 35 s seen with
#: a longer state while vLLM warmed up beside it).
DRAIN_TIMEOUT = 90.0
#: The gateway reads one at a time with llama.cpp's prompt cache on, the direct read is
#: reproducible (no cache): the README ("Reproducibility") measured reads of one prompt up to
#: 0.060 apart with prompt-cache reuse, and this suite saw 0.059 once (with states that
#: differed only in their first line; 0.0 on the others); test_load_live.py's bound. What
#: ties an answer to its request exactly is checked separately: its prompt and its tokens.
CACHED_READ_TOLERANCE = 0.10


def questions_of(raw: dict[str, Any]) -> dict[str, tv.Question]:
    return questions_from_system_one(raw)


def drain_state(n: int) -> str:
    """Request ``n``'s state: every line names ``n``, so no two states share a cached prefix
    past their first words."""
    lines = (
        f"Line {i}: the parcel for order {n * 1000 + i * 31} was late and the box was damaged."
        for i in range(COMPLAINT_LINES)
    )
    return f"Request {n} of the shutdown test. " + " ".join(lines)


class GatewayProcess:
    """``typevet-async serve`` in a child process: its URL, once it logs that it listens, and
    every line it logged."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        command = [sys.executable, "-m", "typevet_async._apps.cli", "serve", "--port", "0", *args]
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        self.lines: list[str] = []
        listening: queue.Queue[str] = queue.Queue()
        self.reader = threading.Thread(target=self._read, args=(listening,), daemon=True)
        self.reader.start()
        self.url = listening.get(timeout=60)

    def _read(self, listening: queue.Queue[str]) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))
            found = re.search(r"serving System One on (http://\S+)", line)
            if found:
                listening.put(found[1])
        listening.put("")  # the process ended (an empty URL fails the test at once)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.reader.join(10)
        assert self.process.stderr is not None
        self.process.stderr.close()


@pytest.fixture
def gateway_process(gemma3_url: str, tmp_path: Path) -> Iterator[Callable[..., GatewayProcess]]:
    started: list[GatewayProcess] = []

    def start(*args: str) -> GatewayProcess:
        keys = tmp_path / "keys.txt"
        keys.write_text(f"# the test's key\n{KEY}\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("TYPEVET_")}
        gateway = GatewayProcess(["--base-url", gemma3_url, "--keys-file", str(keys), *args], env)
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        gateway.stop()


async def wait_until_judging(http: aiohttp.ClientSession, url: str, count: int) -> None:
    """Until the gateway's own gauge says ``count`` requests hold a slot."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        async with http.get(f"{url}/metrics") as response:
            text = await response.text()
        gauge = re.search(r"^typevet_gateway_in_flight (\S+)$", text, re.MULTILINE)
        if gauge and float(gauge[1]) >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{count} requests were never judged at once")


async def connection_refused(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except ConnectionRefusedError:
        return True
    writer.close()
    await writer.wait_closed()
    return False


async def post_drain_request(http: aiohttp.ClientSession, url: str, n: int) -> tuple[int, Any]:
    body = {"model": "gemma-3-270m", "state": drain_state(n), "questions": DRAIN_QUESTIONS}
    async with http.post(
        f"{url}/v1/systemone", json=body, headers={"Authorization": f"Bearer {KEY}"}
    ) as response:
        return response.status, (await response.json()) | {"_headers": dict(response.headers)}


@pytest.mark.asyncio
async def test_sigterm_drains_the_requests_in_flight_and_refuses_new_connections(
    gateway_process: Callable[..., GatewayProcess], gemma3_url: str
) -> None:
    gateway = gateway_process(
        "--max-active-requests", str(IN_FLIGHT), "--max-concurrency", "1",
        "--shutdown-timeout", str(DRAIN_TIMEOUT), "--request-deadline", "300",
    )  # fmt: skip
    # A fresh connection per request: none is a pooled one the shutdown closes while idle.
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http:
        asked = [
            asyncio.create_task(post_drain_request(http, gateway.url, n)) for n in range(IN_FLIGHT)
        ]
        await wait_until_judging(http, gateway.url, IN_FLIGHT)
        signalled = time.monotonic()
        gateway.process.send_signal(signal.SIGTERM)
        for _ in range(100):  # the gateway closes its listening socket at once
            if await connection_refused(gateway.port):
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("a new connection was still accepted 2 s after SIGTERM")
        refused_after = time.monotonic() - signalled
        still_in_flight = sum(not task.done() for task in asked)
        with pytest.raises(aiohttp.ClientConnectorError):
            await post_drain_request(http, gateway.url, 99)
        answered = await asyncio.gather(*asked)
    returncode = await asyncio.to_thread(gateway.process.wait, DRAIN_TIMEOUT)
    exited_after = time.monotonic() - signalled
    print(
        f"refused {refused_after:.2f} s after SIGTERM with {still_in_flight} requests in "
        f"flight; exited {exited_after:.1f} s after it"
    )
    assert still_in_flight == IN_FLIGHT  # the refusal came while every request was in flight
    assert returncode == 0, gateway.lines[-20:]
    assert exited_after < DRAIN_TIMEOUT
    assert any("SIGTERM: shutting down" in line for line in gateway.lines)
    # No exception and no error logged (the child runs in asyncio debug mode, inherited from
    # the suite: its slow-callback warnings on a loaded machine are not errors).
    assert not any(
        "Traceback (most recent call last)" in line or " ERROR " in line for line in gateway.lines
    ), [line for line in gateway.lines if "gateway.access" not in line]
    async with tv.Session.llama_cpp(gemma3_url, reproducible=True) as session:
        for n, (status, body) in enumerate(answered):
            assert status == 200, body
            response = ts.SystemOneResponse.model_validate(body)
            assert list(response.answers) == ["refund"]
            # Its own request's answer, exactly: the prompt it was read from is the one a
            # direct judgment of its state renders, and the server evaluated as many tokens.
            prompt = body["x_typevet"]["diagnostics"]["refund"]["prompt"]
            direct = await session.judge(drain_state(n), questions_of(DRAIN_QUESTIONS))
            assert drain_state(n) in prompt
            assert prompt == direct.diagnostics["refund"].prompt
            assert response.usage.input_tokens == direct.usage.prompt_tokens
            answer = direct["refund"]
            assert isinstance(answer, tv.NoulAnswer)
            gap = abs(response.nouls["refund"].noul - answer.noul)
            print(f"request {n}: gateway vs direct read {gap:.1e}")
            assert gap <= CACHED_READ_TOLERANCE


@pytest.mark.asyncio
async def test_past_the_shutdown_timeout_the_judgments_left_answer_503(
    gateway_process: Callable[..., GatewayProcess],
) -> None:
    cut_off = 1.5
    gateway = gateway_process(
        "--max-active-requests", str(IN_FLIGHT), "--max-concurrency", "1",
        "--shutdown-timeout", str(cut_off), "--request-deadline", "300",
    )  # fmt: skip
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        asked = [
            asyncio.create_task(post_drain_request(http, gateway.url, n + 10))
            for n in range(IN_FLIGHT)
        ]
        await wait_until_judging(http, gateway.url, IN_FLIGHT)
        signalled = time.monotonic()
        gateway.process.send_signal(signal.SIGTERM)
        answered = await asyncio.gather(*asked)
    returncode = await asyncio.to_thread(gateway.process.wait, 30)
    exited_after = time.monotonic() - signalled
    statuses = [status for status, _ in answered]
    print(f"statuses {statuses}; exited {exited_after:.1f} s after SIGTERM")
    assert returncode == 0, gateway.lines[-20:]
    # Four reads of about 2 s, one at a time: at most one ends inside 1.5 s.
    assert statuses.count(503) >= IN_FLIGHT - 1
    for status, body in answered:
        if status == 200:
            ts.SystemOneResponse.model_validate(body)
            continue
        assert status == 503
        assert body["_headers"]["Retry-After"] == "1"
        assert body["detail"]["error_type"] == "unavailable"  # not a validation failure
        assert "shut down" in body["detail"]["message"]
    # The timeout, then the cut-off and closing the session: no read is waited for.
    assert cut_off <= exited_after < cut_off + 5


# -- images: the official client's multipart body, over servers without vision ------------

#: Enough for the SDK's `tv.Image` (a PNG signature), not a picture any model could read:
#: neither server here has vision, and each must refuse it before judging.
PHOTO = PNG_HEADER + bytes(range(256)) * 8


async def ask_with_an_image(url: str) -> ts.TypeSafeUnprocessableEntityError:
    photo = ts.Image(PHOTO)
    async with ts.AsyncTypeSafeClient(
        api_key=KEY, base_url=url, retry=NO_RETRY, timeout=CLIENT_TIMEOUT
    ) as client:
        with (
            client.attach_assets(photo),
            pytest.raises(ts.TypeSafeUnprocessableEntityError) as raised,
        ):
            await client.system_one(
                state={"message": "The box arrived crushed.", "photo": f"{photo}"},
                questions={"damaged": {"type": "noul", "instructions": f"Is {photo} damaged?"}},
            )
    ts_models.HTTPValidationError.model_validate(raised.value.body)
    return raised.value


@pytest.mark.asyncio
async def test_an_image_for_llama_cpp_without_vision_is_the_clients_422(gateway_url: str) -> None:
    refused = await ask_with_an_image(gateway_url)
    assert refused.status == 422
    # The SDK's own refusal (InvalidInputError), made before any scoring read.
    assert "does not declare vision" in refused.body["detail"][0]["msg"]


# -- over vLLM ---------------------------------------------------------------------------


def vllm_session(url: str) -> tv.Session:
    # One read at a time, as test_vllm_live.py reads when it compares two reads.
    return tv.Session.vllm(url, model=VLLM_MODEL_ID, max_concurrency=1)


@pytest_asyncio.fixture
async def vllm_gateway_url(vllm_url: str) -> AsyncIterator[str]:
    async with running_gateway(vllm_session(vllm_url)) as url:
        yield url


async def vllm_direct_answers(vllm_url: str) -> dict[str, Any]:
    call = request_from_system_one({"model": "any", "state": STATE, "questions": QUESTIONS})
    async with vllm_session(vllm_url) as session:
        judgment = await session.judge(call.state, call.questions)
    return dict(judgment.answers)


@pytest.mark.asyncio
async def test_over_vllm_the_async_client_gets_the_direct_answers(
    vllm_gateway_url: str, vllm_url: str
) -> None:
    # Same conditions, as test_vllm_live.py compares reads: one read at a time, and every
    # prompt read once before either side reads it (both then meet the same prefix cache).
    await vllm_direct_answers(vllm_url)
    async with ts.AsyncTypeSafeClient(
        api_key=KEY, base_url=vllm_gateway_url, retry=NO_RETRY, timeout=CLIENT_TIMEOUT
    ) as client:
        response = await client.system_one(state=STATE, questions=QUESTIONS)
        listed = await client.models.list()
    direct = await vllm_direct_answers(vllm_url)
    # 1e-6: vLLM on CPU in fp32 reads the same messages bit for bit (test_vllm_live.py, README
    # "Reproducibility"); 1e-6 is float32 rounding, not a tolerance for a different read.
    assert_same(response, direct)
    assert response.model == VLLM_MODEL_ID  # the session's pinned model, not the client's
    assert [m.name for m in listed.models] == [VLLM_MODEL_ID]


@pytest.mark.asyncio
async def test_over_vllm_the_sync_client_gets_the_direct_answers(
    vllm_gateway_url: str, vllm_url: str
) -> None:
    await vllm_direct_answers(vllm_url)

    def ask() -> ts.SystemOneResponse:
        with ts.TypeSafeClient(
            api_key=KEY, base_url=vllm_gateway_url, retry=NO_RETRY, timeout=CLIENT_TIMEOUT
        ) as c:
            return c.system_one(state=STATE, questions=QUESTIONS, model="gemma-3-270m")

    response = await asyncio.to_thread(ask)
    assert_same(response, await vllm_direct_answers(vllm_url))


@pytest.mark.asyncio
async def test_over_vllm_a_wrong_key_and_bad_questions_are_the_clients_errors(
    vllm_gateway_url: str,
) -> None:
    bad: dict[str, Any] = {
        "q": {"type": "choice", "instructions": "Which?", "criteria": {"only": None}}
    }
    async with ts.AsyncTypeSafeClient(
        api_key="wrong", base_url=vllm_gateway_url, retry=NO_RETRY, timeout=CLIENT_TIMEOUT
    ) as client:
        with pytest.raises(ts.TypeSafeAuthenticationError) as unauthorized:
            await client.system_one(state=STATE, questions=QUESTIONS)
    assert unauthorized.value.status == 401
    async with ts.AsyncTypeSafeClient(
        api_key=KEY, base_url=vllm_gateway_url, retry=NO_RETRY, timeout=CLIENT_TIMEOUT
    ) as client:
        with pytest.raises(ts.TypeSafeUnprocessableEntityError) as invalid:
            await client.system_one(state=STATE, questions=bad)
    assert invalid.value.status == 422
    assert invalid.value.body["detail"][0]["loc"] == ["body", "questions", "q"]


@pytest.mark.asyncio
async def test_over_vllm_an_image_for_a_text_only_model_is_the_clients_422(
    vllm_gateway_url: str,
) -> None:
    # vLLM takes images (the SDK sends them), and refuses them for this text-only model with
    # an HTTP 400: the gateway answers 422, the request's own problem, not a 5xx the client
    # would retry.
    refused = await ask_with_an_image(vllm_gateway_url)
    assert refused.status == 422
    assert refused.body["detail"][0]["type"] == "upstream_refused"
    assert "not a multimodal model" in refused.body["detail"][0]["msg"]
