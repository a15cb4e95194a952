"""Fixtures and hooks of the live tests: real llama.cpp servers (xllamacpp, Gemma 3 270M) and
a real vLLM server, each started once per test session.

A live test that cannot reach its server fails: these fixtures raise, they never skip. What
the tests share besides fixtures is in `tests/live/helpers.py`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

import typevet_async as tv

from .otlp import OtlpReceiver
from .servers import VllmServerProcess

FIXTURES = Path(__file__).parent.parent / "fixtures"


def _start(options: tv.ServerOptions, name: str) -> Iterator[str]:
    logs = tv.cache_dir() / "test-logs"
    logs.mkdir(parents=True, exist_ok=True)
    server = tv.EmbeddedServer(attrs.evolve(options, log_file=logs / f"{name}.log"))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def gemma3_url() -> Iterator[str]:
    """Gemma 3 family through llama.cpp's built-in ``gemma`` template."""
    yield from _start(tv.ServerOptions(chat_template="gemma", n_ctx=8192, n_parallel=4), "gemma3")


@pytest.fixture(scope="session")
def gemma3_long_url() -> Iterator[str]:
    """The same Gemma 3 server with room for 255 options: each of its 2 slots holds 6,144
    tokens (a 255-option question is about 4,400), where ``gemma3_url``'s 4 slots hold 2,048
    (tests of an over-long prompt rely on that limit)."""
    options = tv.ServerOptions(chat_template="gemma", n_ctx=2 * 6144, n_parallel=2)
    yield from _start(options, "gemma3-long")


@pytest.fixture(scope="session")
def gemma4_url() -> Iterator[str]:
    """Gemma 4 family markers through a jinja template with ``<|turn>`` / ``<turn|>``."""
    template = (FIXTURES / "gemma4.jinja").read_text()
    options = tv.ServerOptions(chat_template=template, jinja=True, n_ctx=4096, n_parallel=2)
    yield from _start(options, "gemma4")


@pytest.fixture(scope="session")
def chatml_url() -> Iterator[str]:
    """A ChatML template: judgments must refuse it."""
    template = (FIXTURES / "chatml.jinja").read_text()
    options = tv.ServerOptions(chat_template=template, jinja=True, n_ctx=2048, n_parallel=1)
    yield from _start(options, "chatml")


@pytest.fixture(scope="session")
def real_model_url() -> Iterator[str]:
    """The real instruction model, Qwen2.5 Coder 1.5B Instruct (Q4_K_M, the ``qwen`` extra),
    under its own ChatML template: what these tests assert of answers is what it answers."""
    options = tv.ServerOptions(model="qwen2.5-coder-1.5b", n_ctx=4096, n_parallel=2)
    yield from _start(options, "qwen2.5-coder")


@pytest.fixture(scope="session")
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """Where the vLLM server's own OpenTelemetry exporter sends its spans."""
    receiver = OtlpReceiver()
    receiver.start()
    try:
        yield receiver
    finally:
        receiver.stop()


@pytest.fixture(scope="session")
def vllm_url(otlp_receiver: OtlpReceiver) -> Iterator[str]:
    """vLLM (CPU) serving the same model, dequantised, with --logprobs-mode raw_logprobs, its
    spans exported to `otlp_receiver` (each joined to its request's traceparent).

    ``TYPEVET_TEST_VLLM_URL`` reuses a server started by hand (development only: it must be
    started as tests/live/servers.py starts it).
    """
    reuse = os.environ.get("TYPEVET_TEST_VLLM_URL")
    if reuse:
        yield reuse
        return

    yield from _serve_vllm(VllmServerProcess("vllm", otlp_traces_endpoint=otlp_receiver.endpoint))


def _serve_vllm(server: VllmServerProcess) -> Iterator[str]:
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def _per_backend(request: pytest.FixtureRequest, llama_cpp: str, vllm: str) -> tuple[str, str]:
    fixture = llama_cpp if request.param == "llama_cpp" else vllm
    return request.param, request.getfixturevalue(fixture)


@pytest.fixture(params=["llama_cpp", "vllm"])
def backend(request: pytest.FixtureRequest) -> tuple[str, str]:
    """Runs a test once per backend: (name, URL) of the real server."""
    return _per_backend(request, "gemma3_url", "vllm_url")


QWEN_DIR = tv.cache_dir() / "models" / "qwen3-tiny"
QWEN_TEMPLATE = FIXTURES / "qwen3.jinja"
QWEN_MODEL_ID = "qwen3-tiny"


def _qwen_ready() -> None:
    if not (QWEN_DIR / ".typevet-ready").exists():
        raise RuntimeError(f"{QWEN_DIR} is missing: run scripts/setup_random_models.sh first")


@pytest.fixture(scope="session")
def qwen_llama_url() -> Iterator[str]:
    """llama.cpp serving the random-weight Qwen3 model (the real Qwen tokenizer, built by
    scripts/setup_random_models.sh) under a Qwen3-style template, thinking switchable."""
    _qwen_ready()
    options = tv.ServerOptions(
        model_path=QWEN_DIR / "qwen3-tiny.gguf",
        chat_template=QWEN_TEMPLATE.read_text(),
        jinja=True,
        n_ctx=4096,
        n_parallel=2,
    )
    yield from _start(options, "qwen3-llama")


@pytest.fixture(scope="session")
def qwen_vllm_url() -> Iterator[str]:
    """vLLM serving the same Qwen3 model (its Hugging Face folder) under the same template."""
    _qwen_ready()
    yield from _serve_random_model("qwen3-vllm", QWEN_DIR, QWEN_MODEL_ID, QWEN_TEMPLATE)


def _serve_random_model(log: str, folder: Path, model_id: str, template: Path) -> Iterator[str]:
    """vLLM serving a random-weight test model's Hugging Face folder: 1 GiB of KV cache is
    plenty for a toy, and leaves room for the other vLLM server of the suite."""
    server = VllmServerProcess(
        log, model=folder / "hf", served_name=model_id, template=template, kv_cache_gib=1
    )
    yield from _serve_vllm(server)


@pytest.fixture(params=["llama_cpp", "vllm"])
def qwen_backend(request: pytest.FixtureRequest) -> tuple[str, str]:
    """Runs a test once per backend serving the Qwen3 model: (name, URL)."""
    return _per_backend(request, "qwen_llama_url", "qwen_vllm_url")


MISTRAL_DIR = tv.cache_dir() / "models" / "mistral-tiny"
MISTRAL_TEMPLATE = FIXTURES / "mistral-v3.jinja"
MISTRAL_MODEL_ID = "mistral-tiny"


@pytest.fixture(scope="session")
def mistral_llama_url() -> Iterator[str]:
    """llama.cpp serving the random-weight model over Mistral 7B Instruct v0.3's SentencePiece
    vocabulary, ``add_space_prefix`` on as real Mistral GGUFs carry it, under its own template
    (Mistral v0.3's, roles alternating; built by scripts/setup_random_models.sh)."""
    if not (MISTRAL_DIR / ".typevet-ready").exists():
        raise RuntimeError(f"{MISTRAL_DIR} is missing: run scripts/setup_random_models.sh first")
    options = tv.ServerOptions(
        model_path=MISTRAL_DIR / "mistral-tiny.gguf", jinja=True, n_ctx=2048, n_parallel=2
    )
    yield from _start(options, "mistral-llama")


@pytest.fixture(scope="module")
def mistral_vllm_url() -> Iterator[str]:
    """vLLM serving the same model (its Hugging Face folder) under the same template; for one
    module only, so that no more than two vLLM servers ever share the machine's memory."""
    yield from _serve_random_model("mistral-vllm", MISTRAL_DIR, MISTRAL_MODEL_ID, MISTRAL_TEMPLATE)


@pytest.fixture(params=["llama_cpp", "vllm"])
def mistral_backend(request: pytest.FixtureRequest) -> tuple[str, str]:
    """Runs a test once per backend serving the Mistral-vocabulary model: (name, URL)."""
    return _per_backend(request, "mistral_llama_url", "mistral_vllm_url")


VLLM_FIXTURES = {"vllm_url", "qwen_vllm_url", "mistral_vllm_url"}
BACKEND_PARAMS = ("backend", "qwen_backend", "mistral_backend")


def _needs_vllm(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    fixtures = set(getattr(item, "fixturenames", ()))
    uses_fixture = bool(fixtures & VLLM_FIXTURES)
    params = callspec.params if callspec is not None else {}
    return uses_fixture or "vllm" in {params.get(name) for name in BACKEND_PARAMS}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the unit tests first, whatever order the paths came in (`pytest tests` collects
    `tests/live` first): a unit failure then shows in minutes, not after the live tier. Run the
    vLLM tests last: its server starts once, and the timing-sensitive llama.cpp tests then run
    before it shares the two cores with them."""
    items.sort(key=lambda item: (item.get_closest_marker("live") is not None, _needs_vllm(item)))
