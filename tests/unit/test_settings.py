"""Settings are checked once, where they are built, in the same words everywhere."""

from __future__ import annotations

from typing import Any

import pytest

import typevet_async as tv

URL = "http://127.0.0.1:1"
#: Values of the wrong type, as an untyped caller may pass them.
NOT_A_BOOL: Any = "no"
NOT_A_FRAMING: Any = "client"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_concurrency": 0}, "max_concurrency must be a positive integer, got 0"),
        ({"max_concurrency": True}, "max_concurrency must be a positive integer, got True"),
        ({"max_concurrency": 2.0}, "max_concurrency"),
        ({"max_images": 0}, "max_images"),
        ({"max_image_bytes": -1}, "max_image_bytes"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"off_menu_threshold": 1.5}, r"off_menu_threshold must be in \[0, 1\] or None"),
        ({"raise_off_menu": 1}, "raise_off_menu must be True or False"),
        ({"layout": "nope"}, "layout must be one of 'typevet', 'fused', 'split'"),
        (
            {"prefix_reuse": "nope"},
            "prefix_reuse must be one of 'auto', 'first', 'sequential', 'off', got 'nope'",
        ),
    ],
)
def test_bad_session_settings(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(tv.ConfigurationError, match=message):
        tv.SessionSettings(**settings)
    with pytest.raises(tv.ConfigurationError, match=message):  # the factories' same check
        tv.Session.llama_cpp(URL, **settings)


def test_an_unknown_session_setting_is_refused() -> None:
    with pytest.raises(
        tv.ConfigurationError, match=r"unknown session setting\(s\) \['max_concurency'\]"
    ):
        tv.Session.llama_cpp(URL, max_concurency=4)
    with pytest.raises(tv.ConfigurationError, match="unknown session setting"):
        tv.Session.vllm(URL, model="m", concurrency=4)
    with pytest.raises(tv.ConfigurationError, match="unknown session setting"):
        tv.Session.local(top_n=20)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"top_k": True}, "top_k must be a positive integer, got True"),
        ({"top_k": 0}, "top_k must be a positive integer, got 0"),
        ({"on_missing": "nope"}, "on_missing must be one of 'exact', 'clamp', 'error', got 'nope'"),
        ({"reproducible": "yes"}, "reproducible must be True or False"),
        ({"http": {"request_timeout": 0}}, "http must be a tv.HttpSettings or None"),
        ({"logprobs_mode": "raw_logprobs"}, "logprobs_mode applies to vllm, not llama_cpp"),
        ({"keepalive": 1.0}, r"keepalive is a field of http=tv.HttpSettings\(keepalive=...\)"),
    ],
)
def test_bad_llama_cpp_options(options: dict[str, Any], message: str) -> None:
    with pytest.raises(tv.ConfigurationError, match=message):
        tv.Session.llama_cpp(URL, **options)


def test_a_llama_cpp_backend_needs_a_url_or_server_options_not_both() -> None:
    with pytest.raises(tv.ConfigurationError, match="either base_url or embedded server"):
        tv.LlamaCppConfig()
    with pytest.raises(tv.ConfigurationError, match="either base_url or embedded server"):
        tv.LlamaCppConfig(base_url=URL, server=tv.ServerOptions())
    with pytest.raises(tv.ConfigurationError, match="base_url must be an http"):
        tv.LlamaCppConfig(base_url="localhost")


@pytest.mark.parametrize(
    ("options", "top_k"),
    [(2, 64), (3, 128), (4, 128), (5, 256), (10, 512), (16, 512), (20, 1024), (36, 2048),
     (128, 4096), (1000, 4096)],
)  # fmt: skip
def test_the_first_exact_read_holds_32_entries_per_option(options: int, top_k: int) -> None:
    assert tv.LlamaCppConfig(base_url=URL).first_top_k(options) == top_k


def test_a_set_top_k_and_the_single_read_policies_ignore_the_menu() -> None:
    set_k = tv.LlamaCppConfig(base_url=URL, top_k=50)
    clamp = tv.LlamaCppConfig(base_url=URL, on_missing="clamp")
    error = tv.LlamaCppConfig(base_url=URL, on_missing="error")
    clamp_set_k = tv.LlamaCppConfig(base_url=URL, on_missing="clamp", top_k=50)
    for options in (2, 36):
        assert set_k.first_top_k(options) == 50
        assert clamp.first_top_k(options) == 20
        assert error.first_top_k(options) == 20
        assert clamp_set_k.first_top_k(options) == 50


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"model": "m", "logprobs_mode": "nope"},
            "logprobs_mode must be one of 'raw_logprobs', 'processed_logprobs', 'raw_logits', "
            "'processed_logits', got 'nope'",
        ),
        ({"model": " "}, "needs model"),
        ({}, "Session.vllm needs model="),
        ({"model": "m", "top_k": 5}, "top_k applies to llama_cpp, not vllm"),
    ],
)
def test_bad_vllm_options(options: dict[str, Any], message: str) -> None:
    with pytest.raises(tv.ConfigurationError, match=message):
        tv.Session.vllm(URL, **options)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: tv.HttpSettings(request_timeout=0), "request_timeout"),
        (lambda: tv.HttpSettings(time_slice=0), "time_slice must be a positive, finite number"),
        (lambda: tv.HttpSettings(time_slice="1ms"), "time_slice must be a positive, finite"),
        (lambda: tv.RetryPolicy(max_retries=True), "max_retries must be an integer >= 0"),
        (lambda: tv.HttpSettings(max_connections=0), "max_connections"),
        (lambda: tv.HttpSettings(keepalive=float("nan")), "keepalive"),
        (lambda: tv.HttpSettings(verify_tls=NOT_A_BOOL), "verify_tls"),
        (lambda: tv.RetryPolicy(max_retries=-1), "max_retries"),
        (lambda: tv.RetryPolicy(jitter=-0.5), "jitter"),
        (lambda: tv.ServerOptions(n_parallel=0), "n_parallel"),
        (lambda: tv.ServerOptions(port=-1), "port"),
        (
            lambda: tv.Capabilities(
                framing=NOT_A_FRAMING, prefix_reuse=False, generation_images=False
            ),
            "framing must be one of 'sdk', 'server'",
        ),
    ],
)
def test_bad_backend_settings(build: Any, message: str) -> None:
    with pytest.raises(tv.ConfigurationError, match=message):
        build()


def test_settings_records_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        tv.RetryPolicy(3)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        tv.SessionSettings(4)  # type: ignore[call-arg]


def test_unset_is_its_own_sentinel() -> None:
    assert tv.UNSET is not None
    assert repr(tv.UNSET) == "UNSET"
    assert isinstance(tv.UNSET, tv.Unset)


@pytest.mark.parametrize(
    "factory",
    [
        lambda **options: tv.Session.llama_cpp(URL, **options),
        lambda **options: tv.Session.vllm(URL, model="m", **options),
        lambda **options: tv.Session.system_one(URL, **options),
    ],
    ids=["llama_cpp", "vllm", "system_one"],
)
@pytest.mark.parametrize("time_slice", [None, 0.004])
def test_the_time_slice_reaches_the_backends_http_client(factory: Any, time_slice: Any) -> None:
    from typevet_async._concurrency.slicing import SLICE

    assert factory()._backend.http.settings.time_slice == SLICE  # the default: 1 ms
    http = tv.HttpSettings(time_slice=time_slice)
    assert factory(http=http)._backend.http.settings.time_slice == time_slice


def test_the_time_slice_reaches_every_replicas_http_client() -> None:
    session = tv.Session.llama_cpp(
        [URL, "http://127.0.0.1:2"], http=tv.HttpSettings(time_slice=None)
    )
    clients = [endpoint.backend.http for endpoint in session._backend._endpoints]
    assert [client.settings.time_slice for client in clients] == [None, None]
