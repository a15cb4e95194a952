"""Real llama.cpp servers (xllamacpp, Gemma 3 270M), started once per test session.

A live test that cannot reach its server fails: these fixtures raise, they never skip.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import typevet_async as tv
from typevet_async._core.readings import softmax
from typevet_async._backends.embedded import ServerOptions, ServerProcess, cache_dir

FIXTURES = Path(__file__).parent.parent / "fixtures"


def _start(options: ServerOptions, name: str) -> Iterator[str]:
    logs = cache_dir() / "test-logs"
    logs.mkdir(parents=True, exist_ok=True)
    server = ServerProcess(attrs_evolve(options, log_file=logs / f"{name}.log"))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def attrs_evolve(options: ServerOptions, **changes: Any) -> ServerOptions:
    import attrs

    return attrs.evolve(options, **changes)


@pytest.fixture(scope="session")
def gemma3_url() -> Iterator[str]:
    """Gemma 3 family through llama.cpp's built-in ``gemma`` template."""
    yield from _start(ServerOptions(chat_template="gemma", n_ctx=8192, n_parallel=4), "gemma3")


@pytest.fixture(scope="session")
def gemma4_url() -> Iterator[str]:
    """Gemma 4 family markers through a jinja template with ``<|turn>`` / ``<turn|>``."""
    template = (FIXTURES / "gemma4.jinja").read_text()
    options = ServerOptions(chat_template=template, jinja=True, n_ctx=4096, n_parallel=2)
    yield from _start(options, "gemma4")


@pytest.fixture(scope="session")
def chatml_url() -> Iterator[str]:
    """A ChatML template: judgments must refuse it."""
    template = (FIXTURES / "chatml.jinja").read_text()
    options = ServerOptions(chat_template=template, jinja=True, n_ctx=2048, n_parallel=1)
    yield from _start(options, "chatml")


def post_json(url: str, path: str, body: dict[str, Any]) -> Any:
    """An independent read, outside the SDK: plain urllib and json."""
    request = urllib.request.Request(
        f"{url}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def whole_vocabulary_logprobs(url: str, prompt: str, *, cache_prompt: bool) -> dict[int, float]:
    """Every token's logprob at the answer position, read without the SDK."""
    payload = post_json(
        url,
        "/completion",
        {"prompt": prompt, "n_predict": 0, "n_probs": 262_144, "cache_prompt": cache_prompt},
    )
    top = payload["completion_probabilities"][0]["top_logprobs"]
    return {int(item["id"]): float(item["logprob"]) for item in top}


class InFlightCounter:
    """Counts concurrent HTTP requests to one path through aiohttp's trace hooks."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.current = 0
        self.peak = 0
        self.started = 0
        #: Requests that received a response (cancelled ones never do).
        self.ended = 0
        self.config = aiohttp.TraceConfig()
        self.config.on_request_start.append(self._start)
        self.config.on_request_end.append(self._responded)
        self.config.on_request_exception.append(self._end)

    async def _start(self, _: Any, __: Any, params: aiohttp.TraceRequestStartParams) -> None:
        if params.url.path == self.path:
            self.current += 1
            self.started += 1
            self.peak = max(self.peak, self.current)

    async def _end(self, _: Any, __: Any, params: Any) -> None:
        if params.url.path == self.path:
            self.current -= 1

    async def _responded(self, _: Any, __: Any, params: Any) -> None:
        if params.url.path == self.path:
            self.ended += 1
        await self._end(_, __, params)


@pytest.fixture(scope="session")
def vllm_url() -> Iterator[str]:
    """vLLM (CPU) serving the same model, dequantised, with --logprobs-mode raw_logprobs.

    ``TYPEVET_TEST_VLLM_URL`` reuses a server started by hand (development only: it must be
    started as tests/live/servers.py starts it).
    """
    from .servers import VllmServerProcess

    reuse = os.environ.get("TYPEVET_TEST_VLLM_URL")
    if reuse:
        yield reuse
        return

    server = VllmServerProcess("vllm")
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def vllm_candidate_read(
    url: str, content: str, token_ids: tuple[int, ...], *, top_logprobs: int = 0
) -> dict[str, Any]:
    """An independent vLLM read outside the SDK: plain urllib and json."""
    from .servers import VLLM_MODEL_ID

    body: dict[str, Any] = {
        "model": VLLM_MODEL_ID,
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


def _needs_vllm(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    uses_fixture = "vllm_url" in getattr(item, "fixturenames", ())
    return uses_fixture or (callspec is not None and callspec.params.get("backend") == "vllm")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the vLLM tests last: its server starts once, and the timing-sensitive llama.cpp
    tests then run before it shares the two cores with them."""
    items.sort(key=_needs_vllm)


def assert_same_read(read: Sequence[float], whole_vocabulary: Sequence[float]) -> None:
    """A top-K read equals a whole-vocabulary read of the same prompt up to one common shift.

    llama.cpp sums the softmax normaliser in float32 in an order that depends on n_probs, so
    a top-K read's logprobs can differ from a whole-vocabulary read's by the same amount for
    every token (measured up to 4.7e-4 at K=4096; none from K=16384 on the prompts we tried).
    The shift cancels in the answer's softmax: probabilities and the rest agree to 1e-6.
    """
    differences = [a - b for a, b in zip(read, whole_vocabulary, strict=True)]
    shift = sum(differences) / len(differences)
    assert abs(shift) <= 1e-3, f"normaliser shift {shift} is larger than float32 rounding"
    assert all(abs(d - shift) <= 1e-6 for d in differences), differences
    assert softmax(read) == pytest.approx(softmax(whole_vocabulary), abs=1e-6)


@pytest.fixture(params=["llama_cpp", "vllm"])
def backend(request: pytest.FixtureRequest) -> tuple[str, str]:
    """Runs a test once per backend: (name, URL) of the real server."""
    fixture = "gemma3_url" if request.param == "llama_cpp" else "vllm_url"
    return request.param, request.getfixturevalue(fixture)


def make_session(backend: tuple[str, str], **settings: Any) -> tv.Session:
    """A session on the backend the `backend` fixture picked."""
    from .servers import VLLM_MODEL_ID

    name, url = backend
    if name == "vllm":
        return tv.Session.vllm(url, model=VLLM_MODEL_ID, **settings)
    return tv.Session.llama_cpp(url, **settings)
