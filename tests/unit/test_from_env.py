from __future__ import annotations

import pytest

import typevet_async as tv
from typevet_async._backends.http import HttpClient
from typevet_async._backends.llama_cpp import AsyncLlamaCpp
from typevet_async._backends.vllm import AsyncVllm


def test_llama_cpp_from_env() -> None:
    session = tv.Session.from_env(
        {
            "TYPEVET_BASE_URL": "http://127.0.0.1:8080",
            "TYPEVET_MAX_CONCURRENCY": "7",
            "TYPEVET_MODEL": "gemma",
            "TYPEVET_API_KEY": "k",
        }
    )
    assert isinstance(session.backend, AsyncLlamaCpp)
    assert session.backend.http.base_url == "http://127.0.0.1:8080"
    assert session.max_concurrency == 7
    assert session.model == "gemma"
    assert session._server is None


def test_vllm_from_env() -> None:
    session = tv.Session.from_env(
        {"TYPEVET_BACKEND": "vllm", "TYPEVET_BASE_URL": "http://h:8000", "TYPEVET_MODEL": "m"}
    )
    assert isinstance(session.backend, AsyncVllm)
    assert session.backend.model == "m"
    assert session.model == "m"


def test_no_base_url_means_the_embedded_server() -> None:
    session = tv.Session.from_env({})
    assert session._server is not None
    assert session.max_concurrency == 4


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TYPEVET_BACKEND": "vllm"}, "needs TYPEVET_BASE_URL and TYPEVET_MODEL"),
        ({"TYPEVET_BACKEND": "vllm", "TYPEVET_BASE_URL": "http://h"}, "TYPEVET_MODEL"),
        ({"TYPEVET_BACKEND": "tgi"}, "must be 'llama_cpp' or 'vllm'"),
        ({"TYPEVET_MAX_CONCURRENCY": "many"}, "positive integer"),
        ({"TYPEVET_MAX_CONCURRENCY": "0"}, "positive integer"),
    ],
)
def test_bad_environment(env: dict[str, str], message: str) -> None:
    with pytest.raises(tv.ConfigurationError, match=message):
        tv.Session.from_env(env)


def test_bad_session_settings() -> None:
    with pytest.raises(tv.ConfigurationError, match="max_concurrency"):
        tv.Session(AsyncLlamaCpp(HttpClient("http://127.0.0.1:1")), max_concurrency=0)
    with pytest.raises(tv.ConfigurationError, match="top_k"):
        tv.Session.llama_cpp("http://127.0.0.1:1", top_k=0)
    reproducible = tv.Session.llama_cpp("http://127.0.0.1:1", max_concurrency=8, reproducible=True)
    assert reproducible.max_concurrency == 1
