"""What the live tests share: the ticket and questions, independent reads outside the SDK,
request counters and the checks several test modules make.

Test modules import from here (and from `.servers` and `.faults`), never from each other or
from the conftest, which holds only fixtures and hooks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
import traceback
import urllib.request
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import anyio
import pytest
from aiohttp import web

import typevet_async as tv
from typevet_async._apps.gateway import STATE, GatewayConfig, app_runner, build_app, running
from typevet_async._apps.gateway.state import GatewayState
from typevet_async._core.statistics.content_free import divide_prior

from .servers import VLLM_MODEL_ID

TICKET = "I was charged twice for my order and need a refund today."
#: A minimal PNG header: enough for `tv.Image` to accept it, not a picture any model can read.
PNG_HEADER = b"\x89PNG\r\n\x1a\n"


#: The settings that letter every question, as before issue 44's default (a Noul in words):
#: for tests of reads at the letters' ids.
LETTERED: dict[str, Any] = {
    "noul_controls": "letters",
    "score_controls": "letters",
    "content_free": "off",
}


def questions() -> dict[str, tv.Question]:
    """One question of each type, about `TICKET`."""
    return {
        "refund": tv.Noul(instructions="Is a refund requested?"),
        "route": tv.Choice(
            {"billing": "Money matters", "shipping": None, "technical": None},
            instructions="Which team should handle this?",
        ),
        "urgency": tv.Score(
            ["can wait", "this week", "today", "right now"], instructions="How urgent is this?"
        ),
    }


def png(padding: int = 32) -> tv.Image:
    return tv.Image.from_bytes(PNG_HEADER + b"\0" * padding, "image/png")


def softmax(logprobs: Sequence[float]) -> tuple[float, ...]:
    """The softmax over candidates, computed here, not by the SDK."""
    top = max(logprobs)
    weights = [math.exp(value - top) for value in logprobs]
    total = math.fsum(weights)
    return tuple(weight / total for weight in weights)


def assert_exact_softmax(judgment: tv.Judgment) -> None:
    """Each answer's probabilities are the softmax of the logprobs it read (float64 arithmetic
    on the same numbers: 1e-12 is rounding, not a tuned tolerance), divided by its content-free
    prior where one was (``content_free`` on)."""
    for question_id, answer in judgment.items():
        diagnostics = judgment.diagnostics[question_id]
        expected = softmax(diagnostics.logprobs)
        if diagnostics.content_free_prior is not None:
            assert diagnostics.raw_probabilities == pytest.approx(expected, abs=1e-12)
            expected = divide_prior(expected, diagnostics.content_free_prior)
        assert tuple(answer.probabilities.values()) == pytest.approx(expected, abs=1e-12)


def post_json(url: str, path: str, body: dict[str, Any]) -> Any:
    """An independent request, outside the SDK: plain urllib and json."""
    request = urllib.request.Request(
        f"{url}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def top_logprobs(url: str, prompt: str, n_probs: int, *, cache_prompt: bool) -> dict[int, float]:
    """The top ``n_probs`` logprobs at the answer position of a llama.cpp read, without the SDK."""
    payload = post_json(
        url,
        "/completion",
        {"prompt": prompt, "n_predict": 0, "n_probs": n_probs, "cache_prompt": cache_prompt},
    )
    top = payload["completion_probabilities"][0]["top_logprobs"]
    return {int(item["id"]): float(item["logprob"]) for item in top}


def whole_vocabulary_logprobs(url: str, prompt: str, *, cache_prompt: bool) -> dict[int, float]:
    """Every token's logprob at the answer position, read without the SDK."""
    return top_logprobs(url, prompt, 262_144, cache_prompt=cache_prompt)


def prefill_seconds(url: str, prompt: str) -> tuple[float, int]:
    """How long llama.cpp says it took to evaluate ``prompt`` uncached, and over how many
    tokens: what a test that needs a read to take seconds checks its premise against."""
    payload = post_json(
        url, "/completion", {"prompt": prompt, "n_predict": 0, "n_probs": 1, "cache_prompt": False}
    )
    return float(payload["timings"]["prompt_ms"]) / 1000, int(payload["tokens_evaluated"])


def assert_same_read(read: Sequence[float], whole_vocabulary: Sequence[float]) -> None:
    """A top-K read equals a whole-vocabulary read of the same prompt up to one common shift.

    llama.cpp sums the softmax normaliser in float32 in an order that depends on n_probs, so
    a top-K read's logprobs can differ from a whole-vocabulary read's by the same amount for
    every token (measured up to 4.7e-4 at K=4096, README "What exact means here"; SERVERS.md
    saw up to 1.1e-3 in December 2026 on 12 questions). The bound on the shift, 1e-3, is that
    float32 rounding; the shift cancels in the answer's softmax, where what remains is the
    rounding of each logprob (1e-6).
    """
    differences = [a - b for a, b in zip(read, whole_vocabulary, strict=True)]
    shift = sum(differences) / len(differences)
    assert abs(shift) <= 1e-3, f"normaliser shift {shift} is larger than float32 rounding"
    assert all(abs(d - shift) <= 1e-6 for d in differences), differences
    assert softmax(read) == pytest.approx(softmax(whole_vocabulary), abs=1e-6)


class InFlightCounter:
    """Counts concurrent HTTP requests to one path through aiohttp's trace hooks.

    With ``hold`` > 0, each request to the path is held that many seconds once it has its
    connection (inside the request, as a slow server would hold it).
    """

    def __init__(self, path: str, *, hold: float = 0.0) -> None:
        self.path = path
        self.hold = hold
        self.current = 0
        self.peak = 0
        self.started = 0
        #: Requests that received a response (cancelled ones never do).
        self.ended = 0
        #: Seconds from each request's start to its response, in the order they ended.
        self.durations: list[float] = []
        self.config = aiohttp.TraceConfig()
        self.config.on_request_start.append(self._start)
        self.config.on_request_end.append(self._responded)
        self.config.on_request_exception.append(self._end)

    async def _start(self, _: Any, context: Any, params: aiohttp.TraceRequestStartParams) -> None:
        if params.url.path == self.path:
            self.current += 1
            self.started += 1
            self.peak = max(self.peak, self.current)
            context.started = time.monotonic()
            if self.hold:
                await anyio.sleep(self.hold)

    async def _end(self, _: Any, __: Any, params: Any) -> None:
        if params.url.path == self.path:
            self.current -= 1

    async def _responded(self, _: Any, context: Any, params: Any) -> None:
        if params.url.path == self.path:
            self.ended += 1
            self.durations.append(time.monotonic() - context.started)
        await self._end(_, context, params)


def vllm_candidate_read(
    url: str,
    content: str,
    token_ids: tuple[int, ...],
    *,
    top_logprobs: int = 0,
    model: str = VLLM_MODEL_ID,
) -> dict[int, float]:
    """An independent vLLM read outside the SDK: plain urllib and json."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 1,
        "logprobs": True,
        "return_tokens_as_token_ids": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    if top_logprobs:
        body["top_logprobs"] = top_logprobs
    else:
        body["logprob_token_ids"] = list(token_ids)
    payload = post_json(url, "/v1/chat/completions", body)
    position = payload["choices"][0]["logprobs"]["content"][0]
    return {
        int(entry["token"].split(":", 1)[1]): float(entry["logprob"])
        for entry in position["top_logprobs"]
    }


def make_session(backend: tuple[str, str], **settings: Any) -> tv.Session:
    """A session on the backend the `backend` fixture picked."""
    name, url = backend
    if name == "vllm":
        return tv.Session.vllm(url, model=VLLM_MODEL_ID, **settings)
    return tv.Session.llama_cpp(url, **settings)


def assert_close_json(actual: Any, expected: Any, where: str = "", tolerance: float = 1e-6) -> None:
    """The same JSON-like value: objects with the same keys in the same order, numbers within
    ``tolerance`` (equal reads of reproducible mode are float32 rounding apart at most)."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), where
        assert list(actual) == list(expected), where
        for key, value in expected.items():
            assert_close_json(actual[key], value, f"{where}.{key}", tolerance)
    elif isinstance(expected, float):
        assert actual == pytest.approx(expected, abs=tolerance), where
    else:
        assert actual == expected, where


async def wait_until_ready(url: str, seconds: float = 120.0) -> None:
    """The gateway probes its server in the background: ``/readyz`` is 200 once it has."""
    async with aiohttp.ClientSession() as http:
        for _ in range(int(seconds / 0.1)):
            async with http.get(f"{url}/readyz") as response:
                if response.status == 200:
                    return
            await asyncio.sleep(0.1)
    raise AssertionError(f"the gateway at {url} was not ready within {seconds} s")


@contextlib.asynccontextmanager
async def ready_gateway(session: tv.Session, config: GatewayConfig) -> AsyncIterator[str]:
    """The gateway over ``session``, in-process on a free port, once ``/readyz`` says it has
    probed its server (before that it answers 503): its URL."""
    async with running(session, config) as url:
        await wait_until_ready(url)
        yield url


@contextlib.asynccontextmanager
async def ready_gateway_state(
    session: tv.Session, config: GatewayConfig
) -> AsyncIterator[tuple[str, GatewayState]]:
    """`ready_gateway`, and the gateway's running state (admission, slots) for a test to read
    or set."""
    app = build_app(session, config)
    runner = app_runner(app, config)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        url = f"http://{host}:{port}"
        await wait_until_ready(url)
        yield url, app[STATE]
    finally:
        await runner.cleanup()


def shown(error: BaseException) -> str:
    """Everything a caller, a log or a traceback gets out of ``error`` and its chain."""
    texts = ["".join(traceback.format_exception(error))]
    current: BaseException | None = error
    while current is not None:
        texts += [str(current), repr(current), repr(vars(current))]
        current = current.__cause__ or current.__context__
    return "\n".join(texts)
