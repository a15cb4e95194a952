"""Secrets never leave the SDK: the API key and the base URL's credentials are absent from every
error message, body excerpt, payload, repr, traceback and batch item, whatever the server echoes.

A real llama.cpp or vLLM server never echoes a key, so the echoes come from the fault-injecting
stub server (named as such), scripted here to send the key back in every place a server can:
the body, the headers, the reason phrase, a redirect's ``Location``, a malformed header line.
"""

from __future__ import annotations

import asyncio
import base64
import json
import traceback
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

import typevet_async as tv
from typevet_async._backends.http import HttpClient
from typevet_async._core.reading.kept_errors import error_chain
from typevet_async._redaction import (
    MASK,
    excerpt,
    redact,
    redact_value,
    redacted_repr,
    register_secret,
)

from .stubs import IDS, FaultInjectingStubServer, noul

#: The key every test here sends; long and unlike any word, so that any trace of it is a leak.
KEY = "sk-live/Zq7+Rr9=echo-0042"
USER, PASSWORD = "alice-ops", "pw:Hunter2@77"
#: The password as a URL must write it (``:`` and ``@`` percent-encoded).
URL_PASSWORD = urllib.parse.quote(PASSWORD, safe="")
PROBE = tv.Probe(tv.TemplateFamily.GEMMA3, "rendered", IDS, 262_144)
FAST = tv.RetryPolicy(max_retries=0)


def forms_of(secret: str) -> list[str]:
    """The forms in which a leak would be recognisable."""
    return [secret, urllib.parse.quote(secret, safe=""), json.dumps(secret)[1:-1]]


def leaks(text: str, secrets: list[str]) -> list[str]:
    folded = text.casefold()
    return [secret for secret in secrets if secret.casefold() in folded]


def everything_shown(error: BaseException) -> list[str]:
    """Every text a caller, a log or a traceback can get out of ``error``."""
    shown = ["".join(traceback.format_exception(error))]
    for current in error_chain(error):
        shown += [str(current), repr(current), repr(vars(current)), repr(current.args)]
    return shown


def assert_no_secret(error: BaseException, secrets: list[str]) -> None:
    for text in everything_shown(error):
        assert not leaks(text, secrets), (leaks(text, secrets), text)
    for current in error_chain(error):
        # No error keeps what aiohttp keeps: the request's headers.
        assert not hasattr(current, "request_info"), repr(current)


# -- the redaction step itself ------------------------------------------------------------


def test_a_url_shows_no_user_or_password() -> None:
    assert redact("http://user:pass@host:8080/v1") == f"http://{MASK}@host:8080/v1"
    assert redact("GET https://tok@h/x: HTTP 500") == f"GET https://{MASK}@h/x: HTTP 500"
    # Up to the last @ of the authority, as lenient URL parsers read it.
    assert redact("http://a@b:c@d@host/p@q") == f"http://{MASK}@host/p@q"
    assert redact("mail me: a@b.c, see http://host/x@y") == "mail me: a@b.c, see http://host/x@y"
    assert redacted_repr("http://u:p@h") == repr(f"http://{MASK}@h")
    assert redacted_repr(None) == "None"


def test_a_registered_secret_is_masked_in_any_case_and_form() -> None:
    register_secret("sk-REDACT-me-0001")
    text = 'Authorization: Bearer sk-redact-ME-0001; {"key": "sk-REDACT-me-0001"}'
    assert redact(text) == f'Authorization: Bearer {MASK}; {{"key": "{MASK}"}}'


def test_a_form_too_short_to_tell_from_text_is_not_registered_but_its_longer_forms_are() -> None:
    # Masked everywhere, "k" would garble every later error of the process (top_k -> top_***).
    HttpClient("http://x", tv.HttpSettings(api_key="k"))
    assert (
        redact("top_k must be a positive integer, got k")
        == "top_k must be a positive integer, got k"
    )
    assert redact("you sent 'Bearer k'") == f"you sent '{MASK}'"
    # A long key needs no header form of its own, so the word "Bearer" is never a fragment.
    HttpClient("http://x", tv.HttpSettings(api_key="sk-long-enough-0005"))
    assert redact("WWW-Authenticate: Bearer") == "WWW-Authenticate: Bearer"
    assert redact("Bearer sk-long-enough-0005") == f"Bearer {MASK}"
    # A short user and password: their pair (and its Basic-auth base64) are long enough, and a
    # URL's user and password are always masked.
    HttpClient("http://alice:pw@h")
    pair = base64.b64encode(b"alice:pw").decode()
    said = f"alice:pw ({pair}) said no at http://alice:pw@h"
    assert redact(said) == f"{MASK} ({MASK}) said no at http://{MASK}@h"


def test_a_secret_cut_by_an_excerpt_leaves_no_fragment() -> None:
    register_secret("sk-FRAGMENT-abcdef-0002")
    assert redact("the key was sk-FRAGMENT-ab") == f"the key was {MASK}"
    # Cut at 20 characters, the key straddling the cut is masked whole before the cut.
    text = "x" * 15 + "sk-FRAGMENT-abcdef-0002" + "y" * 10
    assert excerpt(text, 20) == ("x" * 15 + MASK + "y" * 10)[:20]


def test_a_payload_is_redacted_through_its_containers_and_kept_when_clean() -> None:
    register_secret("sk-PAYLOAD-0003")
    payload = {"a": ["sk-PAYLOAD-0003", 1, None], "sk-PAYLOAD-0003": (b"sk-PAYLOAD-0003",)}
    assert redact_value(payload) == {"a": [MASK, 1, None], MASK: (MASK.encode(),)}
    clean = {"a": [1, "b"]}
    assert redact_value(clean) is clean
    # A cyclic payload (not JSON, but an error may be given one) is walked once.
    cyclic: list[Any] = [1]
    cyclic.append(cyclic)
    assert redact_value(cyclic) is cyclic
    cyclic.append("sk-PAYLOAD-0003")
    assert redact_value(cyclic) == [1, MASK, MASK]


@pytest.mark.parametrize(
    "build",
    [
        lambda m: tv.ServerError(m, status=500, body=m),
        lambda m: tv.ProtocolError(m, payload={"body": m}),
        lambda m: tv.GenerationError(m, raw=m, payload=[m]),
        lambda m: tv.OutputValidationError(m, raw=m, value={"v": m}, path="$.v"),
        lambda m: tv.TruncatedOutputError(m, raw=m),
        lambda m: tv.UnsupportedTemplateError(m, family="x", rendered=m),
        lambda m: tv.TransportError(m),
        lambda m: tv.InvalidLogprobsError(m, payload=m),
        lambda m: tv.BatchRecordError(m),
    ],
)
def test_every_error_redacts_its_message_and_fields_whoever_builds_it(build: Any) -> None:
    HttpClient("http://x", tv.HttpSettings(api_key=KEY))  # registers the key
    error = build(f"echoed: Bearer {KEY} from http://{USER}:{URL_PASSWORD}@h")
    error.question_id = f"q-{KEY}"
    error.add_note(f"note {KEY}")
    assert_no_secret(error, [KEY, USER, URL_PASSWORD])
    assert MASK in str(error)


# -- against a server that echoes the key everywhere --------------------------------------


@pytest_asyncio.fixture
async def echo() -> AsyncIterator[FaultInjectingStubServer]:
    server = FaultInjectingStubServer(lambda c, n: None)
    server.handler = echoing(server)
    await server.start()
    yield server
    await server.stop()


def raw_reply(status: int, reason: str, headers: dict[str, str], body: bytes) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def echoing(stub: FaultInjectingStubServer) -> Any:
    """Replies that send the request's own credentials back: the whole Authorization header,
    the secret in it (the bearer key, or the Basic pair decoded), each as it came,
    percent-encoded and JSON-escaped, in the body, the headers and the reason phrase, per path.
    """

    def handler(connection: int, number: int) -> bytes:
        head = stub.seen_heads[-1].decode("latin-1")
        request_line, *lines = head.split("\r\n")
        path = request_line.split()[1]
        auth = next(
            v for k, _, v in (x.partition(": ") for x in lines) if k.lower() == "authorization"
        )
        scheme, _, credential = auth.partition(" ")
        secret = base64.b64decode(credential).decode() if scheme == "Basic" else credential
        quoted = urllib.parse.quote(secret, safe="")
        echoes = {"header": auth, "secret": secret, "quoted": quoted, "json": json.dumps(secret)}
        body = json.dumps({"error": f"invalid credentials {auth}", **echoes}).encode()
        headers = {"X-Echo": auth, "WWW-Authenticate": f'Bearer error="{secret}"'}
        if path == "/status":
            return raw_reply(401, f"Bad key {secret}", headers, body)
        if path == "/redirect":
            location = f"http://{USER}:{URL_PASSWORD}@evil.example/?key={quoted}&auth={secret}"
            return raw_reply(302, "Found", {**headers, "Location": location}, body)
        if path == "/header-block":  # a header line that is no header: the key in it
            return f"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n{auth} {secret}\r\n\r\n{{}}".encode()
        if path == "/completion":  # a 200 whose body is not JSON: a ProtocolError's payload
            return raw_reply(200, "OK", headers, b"not json: " + body)
        if path == "/v1/chat/completions":  # a generation that says the key
            content = json.dumps({"colour": secret})
            reply = {
                "choices": [{"finish_reason": "stop", "message": {"content": content}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 5},
            }
            return raw_reply(200, "OK", headers, json.dumps(reply).encode())
        return raw_reply(500, secret, headers, body)

    return handler


class ProbedLlamaCpp(tv.AsyncLlamaCpp):
    """The real llama.cpp backend with its probe known in advance, so that a session sends only
    reads and generations to the stub."""

    async def probe(self) -> tv.Probe:
        return PROBE


def session_on(url: str, **http: Any) -> tv.Session:
    config = tv.LlamaCppConfig(base_url=url, top_k=2, http=tv.HttpSettings(retry=FAST, **http))
    return tv.Session(ProbedLlamaCpp(config), tv.SessionSettings(prefix_reuse="off"))


def with_credentials(url: str) -> str:
    return url.replace("http://", f"http://{USER}:{URL_PASSWORD}@")


async def failures(client: HttpClient) -> list[tv.TypevetError]:
    errors: list[tv.TypevetError] = []
    for path in ("/status", "/redirect", "/header-block", "/other"):
        with pytest.raises(tv.TypevetError) as caught:
            await client.post(path, {})
        errors.append(caught.value)
    return errors


@pytest.mark.asyncio
async def test_a_key_the_server_echoes_is_in_no_error(echo: FaultInjectingStubServer) -> None:
    client = HttpClient(echo.url, tv.HttpSettings(api_key=KEY, retry=FAST))
    await client.open()
    try:
        errors = await failures(client)
    finally:
        await client.aclose()
    assert all(f"Authorization: Bearer {KEY}".encode() in head for head in echo.seen_heads)
    assert [type(error) for error in errors] == [
        tv.ServerError, tv.ServerError, tv.ProtocolError, tv.ServerError
    ]  # fmt: skip
    status, redirect, header_block, _ = errors
    assert isinstance(status, tv.ServerError)
    assert isinstance(redirect, tv.ServerError)
    assert (status.status, redirect.status) == (401, 302)
    assert "invalid credentials Bearer ***" in status.body
    assert "redirect to 'http://***@evil.example/?key=***&auth=***' not followed" in str(redirect)
    assert "Invalid header token" in str(header_block)
    for error in errors:
        assert_no_secret(error, forms_of(KEY))
    assert KEY not in repr(client)


@pytest.mark.asyncio
async def test_url_credentials_the_server_echoes_are_in_no_error_or_repr(
    echo: FaultInjectingStubServer,
) -> None:
    url = with_credentials(echo.url)
    client = HttpClient(url, tv.HttpSettings(retry=FAST))
    await client.open()
    try:
        errors = await failures(client)
    finally:
        await client.aclose()
    # aiohttp sends them as Basic credentials; the stub echoes them decoded and encoded.
    pair = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert all(f"Authorization: Basic {pair}".encode() in head for head in echo.seen_heads)
    secrets = [*forms_of(PASSWORD), URL_PASSWORD, USER, pair]
    for error in errors:
        assert_no_secret(error, secrets)
        assert f"POST http://***@127.0.0.1:{echo.url.rsplit(':', 1)[1]}/" in str(error)
    session = tv.Session.llama_cpp(url)
    vllm = tv.Session.vllm(url, model="m")
    shown = [repr(client), repr(session), repr(session.backend), repr(vllm), repr(vllm.backend)]
    shown += [repr(getattr(s.backend, "config", None)) for s in (session, vllm)]
    assert all(not leaks(text, secrets) for text in shown), shown
    assert all("http://***@127.0.0.1" in text for text in shown), shown


@pytest.mark.asyncio
async def test_an_echoed_key_is_in_no_judgment_error_batch_item_or_generation_error(
    echo: FaultInjectingStubServer,
) -> None:
    secrets = forms_of(KEY)
    async with session_on(echo.url, api_key=KEY) as session:
        with pytest.raises(tv.ProtocolError) as judged:
            await session.judge("state", {"q": noul()})
        items = [item async for item in session.judge_many(["a", "b"], {"q": noul()})]
        schema = {"type": "object", "properties": {"colour": {"enum": ["red"]}}}
        with pytest.raises(tv.OutputValidationError) as generated:
            await session.generate("colour?", schema=schema)
    assert isinstance(judged.value.payload, str)
    assert "not json" in judged.value.payload
    assert [type(item.error) for item in items] == [tv.ProtocolError, tv.ProtocolError]
    assert MASK in generated.value.raw
    assert generated.value.value == {"colour": MASK}
    for error in [judged.value, generated.value, *(item.error for item in items)]:
        assert error is not None
        assert_no_secret(error, secrets)
    assert not leaks(repr(items), secrets)


@pytest.mark.asyncio
async def test_an_error_raised_after_the_session_closed_is_still_redacted(
    echo: FaultInjectingStubServer,
) -> None:
    async with session_on(echo.url, api_key=KEY) as session:
        pass
    # The registry outlives the session: an echo met later (a stored body) is still masked.
    error = tv.ServerError(f"late {KEY}", status=500, body=KEY)
    assert_no_secret(error, forms_of(KEY))
    assert "closed" in repr(session)


@pytest.mark.asyncio
async def test_an_echoed_key_is_not_on_the_command_lines_stderr(
    echo: FaultInjectingStubServer, capsys: pytest.CaptureFixture[str]
) -> None:
    # The probe's first request meets the echo (HTTP 500 with the key): the command fails
    # with one line on stderr, which prints str(error).
    from typevet_async._apps.cli import main

    argv = ["judge", "a ticket", "--noul", "q=Refund?", "--base-url", echo.url, "--api-key", KEY]
    code = await asyncio.to_thread(main, argv)
    out, err = capsys.readouterr()
    assert code == 2
    assert "ServerError" in err
    assert "HTTP 500" in err
    assert MASK in err
    assert not leaks(out + err, forms_of(KEY))
