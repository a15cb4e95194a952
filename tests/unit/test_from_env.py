from __future__ import annotations

import pytest

import typevet_async as tv


def test_llama_cpp_from_env() -> None:
    session = tv.Session.from_env(
        {
            "TYPEVET_BASE_URL": "http://127.0.0.1:8080",
            "TYPEVET_MAX_CONCURRENCY": "7",
            "TYPEVET_MODEL": "gemma",
            "TYPEVET_API_KEY": "k",
        }
    )
    backend = session.backend
    assert isinstance(backend, tv.AsyncLlamaCpp)
    assert backend.base_url == "http://127.0.0.1:8080"
    assert not backend.embedded
    assert backend.model == "gemma"
    assert backend.config.http.api_key == "k"
    assert session.settings.max_concurrency == 7


def test_vllm_from_env() -> None:
    session = tv.Session.from_env(
        {"TYPEVET_BACKEND": "vllm", "TYPEVET_BASE_URL": "http://h:8000", "TYPEVET_MODEL": "m"}
    )
    backend = session.backend
    assert isinstance(backend, tv.AsyncVllm)
    assert backend.model == "m"
    assert backend.config.base_url == "http://h:8000"


def test_system_one_from_the_environment() -> None:
    env = {
        "TYPEVET_BACKEND": "system_one",
        "TYPEVET_BASE_URL": "http://gateway:8000",
        "TYPEVET_MODEL": "jev-latest",
        "TYPEVET_API_KEY": "k-from-env-123",
    }
    backend = tv.Session.from_env(env).backend
    assert isinstance(backend, tv.AsyncSystemOne)
    assert backend.model == "jev-latest"
    assert backend.config.base_url == "http://gateway:8000"
    assert backend.config.http.api_key == "k-from-env-123"


def test_no_base_url_means_the_embedded_server() -> None:
    session = tv.Session.from_env({})
    backend = session.backend
    assert isinstance(backend, tv.AsyncLlamaCpp)
    assert backend.embedded
    assert backend.config.server == tv.ServerOptions()
    assert session.settings.max_concurrency == 4


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TYPEVET_BACKEND": "vllm"}, "needs TYPEVET_BASE_URL and TYPEVET_MODEL"),
        ({"TYPEVET_BACKEND": "vllm", "TYPEVET_BASE_URL": "http://h"}, "TYPEVET_MODEL"),
        ({"TYPEVET_BACKEND": "tgi"}, "must be one of 'llama_cpp', 'vllm', 'system_one', 'openai"),
        ({"TYPEVET_BACKEND": "system_one"}, "system_one needs TYPEVET_BASE_URL"),
        ({"TYPEVET_MAX_CONCURRENCY": "many"}, "positive integer"),
        ({"TYPEVET_MAX_CONCURRENCY": "0"}, "positive integer"),
    ],
)
def test_bad_environment(env: dict[str, str], message: str) -> None:
    with pytest.raises(tv.ConfigurationError, match=message):
        tv.Session.from_env(env)


def test_reproducible_reads_one_question_at_a_time_whatever_max_concurrency() -> None:
    reproducible = tv.Session.llama_cpp("http://127.0.0.1:1", max_concurrency=8, reproducible=True)
    assert reproducible.settings.max_concurrency == 8
    assert reproducible.backend.capabilities.max_concurrency == 1
    default = tv.Session.llama_cpp("http://127.0.0.1:1", max_concurrency=8)
    assert default.backend.capabilities.max_concurrency is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (5, "flags must be a mapping"),
        ({"base-url": "http://h:1"}, r"flags names no setting \['base-url'\]"),
    ],
)
def test_flags_that_are_not_the_settings_are_refused(flags: object, message: str) -> None:
    with pytest.raises(tv.ConfigurationError, match=message):
        tv.Session.from_env({}, flags=flags)  # type: ignore[arg-type]


def test_a_flag_wins_over_its_variable_and_is_named_when_missing() -> None:
    session = tv.Session.from_env(
        {"TYPEVET_BASE_URL": "http://from-env:1"}, flags={"base_url": "http://from-flag:1"}
    )
    assert session.backend.base_url == "http://from-flag:1"
    with pytest.raises(tv.ConfigurationError, match=r"needs --model MODEL \(or TYPEVET_MODEL\)"):
        tv.Session.from_env({}, flags={"backend": "vllm", "base_url": "http://h:1"})
