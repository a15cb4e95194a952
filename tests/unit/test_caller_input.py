"""Bad caller input is a typed error, naming the argument, before any request (issue 13).

Each case is asserted against a session whose backend records every call (nothing may reach
it), or against the raw HTTP stub server (nothing may reach the wire).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

import typevet_async as tv
from typevet_async._core.wires.jsonvalues import compact_json, render_state

from .stubs import FaultInjectingStubServer, InMemoryStubBackend, noul, reply, state_of

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 24
JPEG = b"\xff\xd8\xff\xe0" + b"\0" * 28
SURROGATE = "\ud800"
#: Values of the wrong type, as an untyped caller may pass them.
WRONG: Any = "5"


def session(backend: InMemoryStubBackend, **settings: Any) -> tv.Session:
    return tv.Session(backend, tv.SessionSettings(**settings))


async def refused(
    call: Callable[[tv.Session], Awaitable[Any]],
    error: type[Exception],
    match: str,
    **settings: Any,
) -> InMemoryStubBackend:
    """Run ``call`` on an open session: it must raise ``error`` and reach nothing."""
    backend = InMemoryStubBackend()
    async with session(backend, **settings) as s:
        with pytest.raises(error, match=match):
            await call(s)
    assert backend.probes == 0
    assert backend.read_requests == []
    assert backend.generation_requests == []
    return backend


# -- lone surrogates ----------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("state", "where"),
    [
        (f"my order{SURROGATE}", "state has a lone surrogate '\\\\ud800' at index 8"),
        ({"ticket": ["ok", f"x{SURROGATE}"]}, r"state at \$\.ticket\[1\] has a lone surrogate"),
        ({f"k{SURROGATE}": 1}, r"a key of state at \$ has a lone surrogate"),
        ("\udcff from surrogateescape", "state has a lone surrogate '\\\\udcff' at index 0"),
    ],
)
async def test_a_lone_surrogate_in_a_state_is_refused_before_any_request(
    state: Any, where: str
) -> None:
    await refused(lambda s: s.judge(state, {"q": noul()}), tv.InvalidInputError, where)


@pytest.mark.asyncio
async def test_a_lone_surrogate_in_a_batch_record_is_that_records_error() -> None:
    backend = InMemoryStubBackend()
    async with session(backend) as s:
        items = [item async for item in s.judge_many(["fine", f"bad{SURROGATE}"], {"q": noul()})]
    assert items[0].error is None
    assert isinstance(items[1].error, tv.InvalidInputError)
    assert "state has a lone surrogate" in str(items[1].error)
    assert [state_of(request) for request in backend.read_requests] == ["fine"]


@pytest.mark.parametrize(
    ("build", "where"),
    [
        (lambda: tv.Noul(instructions=f"Refund{SURROGATE}?"), "instructions has a lone"),
        (
            lambda: tv.Noul(instructions="x", criteria={"true": f"yes{SURROGATE}"}),
            "the description of 'true' has a lone",
        ),
        (lambda: tv.Choice([f"a{SURROGATE}", "b"], instructions="x"), "Choice label .* has a"),
        (
            lambda: tv.Choice({"a": f"d{SURROGATE}", "b": None}, instructions="x"),
            "Choice: the description of 'a' has a lone surrogate",
        ),
        (lambda: tv.Score(["low", f"high{SURROGATE}"], instructions="x"), "Score level .* has"),
        (lambda: tv.Score(["low", "high"], instructions=SURROGATE), "instructions has a lone"),
    ],
)
def test_a_lone_surrogate_in_a_question_is_a_question_error(build: Any, where: str) -> None:
    with pytest.raises(tv.QuestionError, match=where):
        build()


@pytest.mark.asyncio
async def test_a_lone_surrogate_in_a_question_id_is_refused() -> None:
    await refused(
        lambda s: s.judge("state", {f"q{SURROGATE}": noul()}),
        tv.QuestionError,
        "question id .* has a lone surrogate",
    )


@pytest.mark.asyncio
async def test_a_lone_surrogate_in_a_prompt_names_the_prompt() -> None:
    await refused(
        lambda s: s.generate_many(["fine", f"bad{SURROGATE}"], schema={"type": "object"}),
        tv.InvalidInputError,
        "prompt 1 has a lone surrogate",
    )
    with pytest.raises(tv.InvalidInputError, match="the prompt has a lone surrogate"):
        tv.GenerationRequest(f"p{SURROGATE}", {}, (), 16)  # however a request is built


@pytest.mark.asyncio
async def test_nothing_reaches_the_wire_with_a_lone_surrogate() -> None:
    """Against a real HTTP client: before the fix, orjson's TypeError at send time."""
    server = FaultInjectingStubServer(lambda _c, _n: reply(500, b"{}"))
    await server.start()
    try:
        async with tv.Session.llama_cpp(
            server.url, http=tv.HttpSettings(retry=tv.RetryPolicy(max_retries=0))
        ) as s:
            with pytest.raises(tv.InvalidInputError, match="state has a lone surrogate"):
                await s.judge(f"x{SURROGATE}", {"q": noul()})
            with pytest.raises(tv.InvalidInputError, match="prompt 0 has a lone surrogate"):
                await s.generate(f"x{SURROGATE}", schema={"type": "string"})
        assert server.requests == []
    finally:
        await server.stop()


# -- JSON states: NaN, Infinity, integers beyond 64 bits -----------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("state", "where"),
    [
        ({"total": math.nan}, r"state at \$\.total is nan"),
        ([1, math.inf], r"state at \$\[1\] is inf"),
        ({"a": {"b": -math.inf}}, r"state at \$\.a\.b is -inf"),
        ({"a": None, "b": math.nan}, r"state at \$\.b is nan"),  # a real null beside it
        ({"big": 2**70, "bad": math.nan}, r"state at \$\.bad is nan"),  # the stdlib path too
    ],
)
async def test_nan_and_infinity_in_a_json_state_are_refused_not_sent_as_null(
    state: Any, where: str
) -> None:
    await refused(lambda s: s.judge(state, {"q": noul()}), tv.InvalidInputError, where)


def test_a_json_state_with_nulls_and_no_nan_renders_as_before() -> None:
    assert render_state({"a": None, "b": [None, 1.5]}) == '{"a":null,"b":[null,1.5]}'


@pytest.mark.parametrize(
    ("state", "text"),
    [
        ({"id": 2**70}, '{"id":1180591620717411303424}'),
        ([-(2**63) - 1, 2**64], "[-9223372036854775809,18446744073709551616]"),
        (
            {"z": "é ‹x›", "big": 10**30, "a": [1, 2.5, None, True], "n": -(10**25)},
            '{"z":"é ‹x›","big":1000000000000000000000000000000,"a":[1,2.5,null,true],'
            '"n":-10000000000000000000000000}',
        ),
        ([2**64 - 1, -(2**63)], "[18446744073709551615,-9223372036854775808]"),  # orjson's own
    ],
)
def test_integers_beyond_64_bits_render_exactly_compact_and_in_order(state: Any, text: str) -> None:
    assert render_state(state) == text
    assert compact_json(state) == text


@pytest.mark.parametrize(
    ("state", "where"),
    [
        ({1: 2**70}, r"state at \$ has a key that is not a string: 1"),
        ({"big": 2**70, "x": object()}, "state must be a JSON value"),
        (10**5000, "state must be a JSON value"),  # beyond Python's own int-to-str limit
    ],
    ids=["int-key", "object", "huge"],
)
def test_big_integers_do_not_open_a_way_around_the_other_checks(state: Any, where: str) -> None:
    with pytest.raises(tv.InvalidInputError, match=where):
        render_state(state)


def test_a_state_that_contains_itself_is_refused() -> None:
    state: list[Any] = [2**70]
    state.append(state)
    with pytest.raises(tv.InvalidInputError, match="nests deeper than 254 levels"):
        render_state(state)


@pytest.mark.asyncio
async def test_a_big_integer_state_is_judged_with_its_exact_digits() -> None:
    backend = InMemoryStubBackend()
    async with session(backend) as s:
        await s.judge({"order": 12345678901234567890123}, {"q": noul()})
    assert state_of(backend.read_requests[0]) == '{"order":12345678901234567890123}'


# -- options of the wrong type or value -----------------------------------------------------

BAD_CALL_OPTIONS = [
    ("timeout", "5", "timeout must be a positive, finite number, got '5'"),
    ("timeout", math.nan, "timeout must be a positive, finite number, got nan"),
    ("timeout", -1, "timeout must be a positive, finite number, got -1"),
    ("timeout", 0, "timeout must be a positive, finite number, got 0"),
    ("timeout", True, "timeout must be a positive, finite number, got True"),
    ("timeout", math.inf, "timeout must be a positive, finite number, got inf"),
    ("max_retries", "1", "max_retries must be an integer >= 0, got '1'"),
    ("max_retries", -1, "max_retries must be an integer >= 0, got -1"),
    ("max_retries", True, "max_retries must be an integer >= 0, got True"),
    ("max_retries", 1.0, "max_retries must be an integer >= 0, got 1.0"),
]


@pytest.mark.asyncio
@pytest.mark.parametrize(("name", "value", "message"), BAD_CALL_OPTIONS)
async def test_judge_refuses_a_bad_option_naming_it(name: str, value: Any, message: str) -> None:
    options = {name: value}
    await refused(lambda s: s.judge("x", {"q": noul()}, **options), tv.ConfigurationError, message)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("off_menu_threshold", "0.5", r"off_menu_threshold must be in \[0, 1\] or None"),
        ("off_menu_threshold", math.nan, r"off_menu_threshold must be in \[0, 1\] or None"),
        ("off_menu_threshold", -0.1, r"off_menu_threshold must be in \[0, 1\] or None"),
        ("off_menu_threshold", True, r"off_menu_threshold must be in \[0, 1\] or None"),
        ("raise_off_menu", "yes", "raise_off_menu must be True or False"),
        ("images", 5, "images must be a tv.Image or a sequence of them"),
        ("images", PNG, r"images must be .*raw bytes: tv.Image.from_bytes"),
    ],
)
async def test_judge_refuses_its_other_bad_options(name: str, value: Any, message: str) -> None:
    options = {name: value}
    await refused(lambda s: s.judge("x", {"q": noul()}, **options), tv.InvalidInputError, message)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        # judge_many's deadline is per record: its name says so.
        *[
            (name, value, message)
            if name != "timeout"
            else ("record_timeout", value, message.replace("timeout", "record_timeout", 1))
            for name, value, message in BAD_CALL_OPTIONS
        ],
        ("max_in_flight", 0, "max_in_flight must be a positive integer, got 0"),
        ("max_in_flight", -2, "max_in_flight must be a positive integer, got -2"),
        ("max_in_flight", "4", "max_in_flight must be a positive integer, got '4'"),
        ("max_in_flight", True, "max_in_flight must be a positive integer, got True"),
        ("window", 0, "window must be a positive integer, got 0"),
        ("window", 2.5, "window must be a positive integer, got 2.5"),
        ("ordered", "no", "ordered must be True or False, got 'no'"),
        ("fail_fast", 1, "fail_fast must be True or False, got 1"),
        ("on_progress", "print", "on_progress must be a callable or None, got 'print'"),
    ],
)
async def test_judge_many_refuses_a_bad_option_at_the_call(
    name: str, value: Any, message: str
) -> None:
    backend = InMemoryStubBackend()
    async with session(backend) as s:
        with pytest.raises(tv.ConfigurationError, match=message):
            s.judge_many(["a", "b"], {"q": noul()}, **{name: value})  # before any anext
    assert backend.probes == 0
    assert backend.read_requests == []


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        *BAD_CALL_OPTIONS,
        ("max_tokens", 0, "max_tokens must be a positive integer, got 0"),
        ("max_tokens", "512", "max_tokens must be a positive integer, got '512'"),
        ("max_tokens", True, "max_tokens must be a positive integer, got True"),
        ("max_in_flight", 0, "max_in_flight must be a positive integer, got 0"),
        ("max_in_flight", -1, "max_in_flight must be a positive integer, got -1"),
        ("max_in_flight", math.nan, "max_in_flight must be a positive integer, got nan"),
        ("return_exceptions", "yes", "return_exceptions must be True or False, got 'yes'"),
    ],
)
async def test_generate_many_refuses_a_bad_option_naming_it(
    name: str, value: Any, message: str
) -> None:
    options = {name: value}
    await refused(
        lambda s: s.generate_many(["p"], schema={"type": "object"}, **options),
        tv.ConfigurationError,
        message,
    )


@pytest.mark.asyncio
async def test_generate_many_refuses_prompts_that_are_not_a_sequence() -> None:
    not_prompts: Any = 5
    await refused(
        lambda s: s.generate_many(not_prompts, schema={"type": "object"}),
        tv.InvalidInputError,
        "prompts must be a sequence of strings, got int",
    )


def test_zero_concurrency_never_means_no_cap() -> None:
    for bad in (0, -1):
        with pytest.raises(tv.ConfigurationError, match="max_concurrency must be a positive"):
            tv.Session.llama_cpp("http://127.0.0.1:1", max_concurrency=bad)
        with pytest.raises(tv.ConfigurationError, match="TYPEVET_MAX_CONCURRENCY must be a posit"):
            tv.Session.from_env({"TYPEVET_MAX_CONCURRENCY": str(bad)})


URL = "http://127.0.0.1:1"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"request_timeout": "x"}, "request_timeout must be a positive, finite number, got 'x'"),
        ({"request_timeout": math.nan}, "request_timeout must be a positive, finite number"),
        ({"request_timeout": True}, "request_timeout must be a positive, finite number"),
        ({"max_retries": "3"}, "max_retries must be an integer >= 0, got '3'"),
        ({"read_timeout": "x"}, r"unknown session setting\(s\) \['read_timeout'\]"),
        ({"trace_configs": 5}, "trace_configs must be a sequence of aiohttp.TraceConfig"),
        ({"trace_configs": ["x"]}, "trace_configs must be a sequence of aiohttp.TraceConfig"),
        ({"api_key": 5}, "api_key must be a string or None, got int"),
        ({"api_key": ""}, "api_key is empty; pass None for no key"),
        ({"api_key": "sk-secret\n"}, r"api_key starts or ends with whitespace \(a trailing"),
        ({"api_key": " sk-secret"}, "api_key starts or ends with whitespace"),
        ({"api_key": "sk-se\ncret"}, "api_key must be visible ASCII"),
        ({"api_key": "sk-sécret"}, "api_key must be visible ASCII"),
    ],
)
@pytest.mark.parametrize("factory", ["llama_cpp", "vllm"])
def test_factory_options_of_the_wrong_type_are_named(
    factory: str, options: dict[str, Any], message: str
) -> None:
    def build() -> tv.Session:
        http = {key: value for key, value in options.items() if key != "read_timeout"}
        if "max_retries" in http:
            http["retry"] = tv.RetryPolicy(max_retries=http.pop("max_retries"))
        keywords = {"http": tv.HttpSettings(**http)} if http else options
        if factory == "vllm":
            return tv.Session.vllm(URL, model="m", **keywords)
        return tv.Session.llama_cpp(URL, **keywords)

    with pytest.raises(tv.ConfigurationError, match=message) as caught:
        build()
    assert "secret" not in str(caught.value)  # a key is never shown


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"model": 5}, "model must be a non-empty string"),
        ({"model": f"m{SURROGATE}"}, "model must be a non-empty string .with no lone surrogate"),
        ({"server": "fast"}, "server must be a tv.ServerOptions or None, got 'fast'"),
    ],
)
def test_llama_cpp_factory_checks_model_and_server(options: dict[str, Any], message: str) -> None:
    with pytest.raises(tv.ConfigurationError, match=message):
        tv.Session.llama_cpp(URL if "model" in options else None, **options)


def test_local_refuses_server_options_of_the_wrong_type() -> None:
    not_options: Any = 0  # falsy: must not silently become the default options
    with pytest.raises(tv.ConfigurationError, match=r"server must be a tv\.ServerOptions"):
        tv.Session.local(server=not_options)


def test_an_api_key_from_the_environment_with_a_newline_is_refused_unshown() -> None:
    env = {"TYPEVET_BASE_URL": URL, "TYPEVET_API_KEY": "sk-secret\n"}
    with pytest.raises(tv.ConfigurationError, match="TYPEVET_API_KEY starts or ends") as caught:
        tv.Session.from_env(env)
    assert "secret" not in str(caught.value)


def test_a_session_refuses_settings_of_the_wrong_type() -> None:
    not_settings: Any = {"max_concurrency": 2}
    with pytest.raises(tv.ConfigurationError, match=r"settings must be a tv\.SessionSettings"):
        tv.Session(InMemoryStubBackend(), not_settings)


def test_a_valid_api_key_and_trace_configs_are_accepted() -> None:
    tv.Session.llama_cpp(
        URL,
        http=tv.HttpSettings(api_key="sk-A1_b2.c3~d4+/e5==", trace_configs=[aiohttp.TraceConfig()]),
    )
    tv.Session.vllm(
        URL,
        model="m",
        http=tv.HttpSettings(api_key=None, trace_configs=()),
    )


# -- a second event loop --------------------------------------------------------------------


def test_a_session_used_from_a_second_event_loop_is_a_session_state_error() -> None:
    backend = InMemoryStubBackend()
    s = session(backend)
    asyncio.run(s.open())
    message = "opened in another event loop"

    async def use() -> None:
        with pytest.raises(tv.SessionStateError, match=message):
            await s.judge("x", {"q": noul()})
        with pytest.raises(tv.SessionStateError, match=message):
            await s.generate("p", schema={"type": "object"})
        with pytest.raises(tv.SessionStateError, match=message):
            await s.probe()
        with pytest.raises(tv.SessionStateError, match=message):
            await s.open()
        with pytest.raises(tv.SessionStateError, match=message):
            s.judge_many(["a"], {"q": noul()})  # at the call, in a running loop
        await s.aclose()  # closing still works: it only lets go of what the session holds

    asyncio.run(use())
    assert backend.probes == 0
    assert backend.read_requests == []
    assert backend.closed == 1


def test_an_http_session_from_a_second_loop_is_refused_before_any_io() -> None:
    """Before the fix: aiohttp's raw ``RuntimeError: Event loop is closed``."""
    s = tv.Session.llama_cpp(URL, http=tv.HttpSettings(retry=tv.RetryPolicy(max_retries=0)))
    asyncio.run(s.open())

    async def use() -> None:
        with pytest.raises(tv.SessionStateError, match="opened in another event loop"):
            await s.judge("x", {"q": noul()})
        await s.aclose()

    asyncio.run(use())


@pytest.mark.asyncio
async def test_the_loop_check_passes_in_the_loop_that_opened_the_session() -> None:
    backend = InMemoryStubBackend()
    async with session(backend) as s:
        await s.open()  # a second open in the same loop is still a no-op
        await s.judge("x", {"q": noul()})
        assert [item.error async for item in s.judge_many(["a", "b"], {"q": noul()})] == [
            None,
            None,
        ]


# -- images ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "mime", "message"),
    [
        (b"hello", "image/png", "image bytes are not a supported image, not image/png"),
        (b"", "image/png", "image data is empty"),
        ("not bytes", "image/png", "image data must be bytes, got str"),
        (None, "image/png", "image data must be bytes, got NoneType"),
        (PNG, "image/jpeg", "image bytes are image/png, not image/jpeg"),
        (JPEG, "image/png", "image bytes are image/jpeg, not image/png"),
        (PNG, "image/gif", "image type 'image/gif' is not supported"),
        (PNG, 5, "image type 5 is not supported"),
    ],
)
def test_an_image_built_directly_makes_the_same_checks(data: Any, mime: Any, message: str) -> None:
    with pytest.raises(tv.InvalidInputError, match=message):
        tv.Image(data, mime)
    if isinstance(data, bytes) and isinstance(mime, str):
        with pytest.raises(tv.InvalidInputError, match=message):
            tv.Image.from_bytes(data, mime)


def test_an_image_built_directly_keeps_good_bytes_as_bytes() -> None:
    image = tv.Image(bytearray(PNG), "image/png")
    assert image.data == PNG
    assert isinstance(image.data, bytes)
    assert tv.Image(memoryview(JPEG), "image/jpeg").data == JPEG


def test_image_size_caps_are_checked() -> None:
    with pytest.raises(tv.InvalidInputError, match="exceeds the 8-byte cap"):
        tv.Image.from_bytes(PNG, "image/png", max_bytes=8)
    not_a_cap: Any = "8"
    with pytest.raises(tv.InvalidInputError, match="max_bytes must be a positive integer"):
        tv.Image.from_bytes(PNG, "image/png", max_bytes=not_a_cap)


@pytest.mark.asyncio
async def test_a_directly_built_image_is_capped_by_the_session() -> None:
    image = tv.Image(PNG, "image/png")  # no cap of its own: the session's applies at the call
    await refused(
        lambda s: s.judge("x", {"q": noul()}, images=image),
        tv.InvalidInputError,
        "exceeds this session's 16-byte cap",
        max_image_bytes=16,
    )


def test_a_batch_built_outside_any_loop_and_run_in_another_is_refused_once() -> None:
    backend = InMemoryStubBackend()
    s = session(backend)
    asyncio.run(s.open())
    stream = s.judge_many(["a", "b"], {"q": noul()})  # no running loop: checked per use

    async def consume() -> None:
        with pytest.raises(tv.SessionStateError, match="opened in another event loop"):
            await anext(stream)
        await stream.aclose()
        await s.aclose()

    asyncio.run(consume())
    assert backend.read_requests == []
