"""`Session.openai_compatible` everywhere a backend goes, against llama.cpp's own
``/v1/chat/completions`` (the embedded server, Gemma 3 270M): the MCP server and ``serve`` in
front of it from the real command line, its OpenTelemetry spans beside `Session.llama_cpp`'s,
retries of the upstream's 429 and 503 after their ``Retry-After``, and its API key sent as a
bearer token and shown nowhere else.

The proxies between the SDK and the real server (`tests.live.faults`) are the named stubs:
`FaultInjectingProxy` answers a scripted request 429 or 503 in the server's stead,
`OpenAIShapedProxy` checks the bearer key as a hosted provider does; every other reply is the
real server's. Answers compared across two reads are read under the same conditions
(`test_openai_compatible_live.py`'s docstring: llama.cpp's chat endpoint reuses its prompt
cache, so a prompt is read once first and compared cached), within `TOLERANCE`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp.client.stdio as mcp_stdio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.types import CallToolResult
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

import typevet_async as tv
from tests.otel import Recorded, everything_recorded, installed

from .faults import FaultInjectingProxy, OpenAIShapedProxy
from .helpers import TICKET, questions, shown, wait_until_ready
from .test_gateway_live import GatewayProcess

pytestmark = [pytest.mark.live, pytest.mark.asyncio]

#: Read noise between two cached reads of one prompt (test_openai_compatible_live.py).
TOLERANCE = 1e-3
ROUTE = {"route": questions()["route"]}
#: An OpenAI-style key: what no log, error, repr, span or cache file may show.
RETRY_TWICE = tv.HttpSettings(retry=tv.RetryPolicy(max_retries=2))
KEY = "sk-proj-Xq7RmT2vLw9ZbN4kPd8sHf3J"
CHAT = "/v1/chat/completions"
TEAMS = ["billing", "shipping"]


@pytest.fixture
def otel() -> Iterator[Recorded]:
    with installed() as recorded:
        yield recorded


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment (its ``PYTHONPATH`` included) without ``TYPEVET_*``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TYPEVET_")}
    return {**env, **extra}


def structured(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


# -- MCP ------------------------------------------------------------------------------------


async def test_the_mcp_server_in_front_of_it_answers_with_probabilities(
    gemma3_url: str, tmp_path: Path
) -> None:
    """``typevet-async mcp --backend openai_compatible --base-url .../v1`` as a real process,
    driven by the MCP SDK's stdio client: its answers are a direct session's."""
    noul = {"q": tv.Noul(instructions="Is a refund requested?")}
    route = {"q": tv.Choice(dict.fromkeys(TEAMS), instructions="Which team?")}
    async with tv.Session.openai_compatible(f"{gemma3_url}/v1", max_concurrency=1) as direct:
        for asked in (noul, route):
            await direct.judge(TICKET, asked)  # cached, as the server's reads below
        parameters = StdioServerParameters(
            command=sys.executable,
            args=[
                *("-m", "typevet_async._apps.cli", "mcp", "--backend", "openai_compatible"),
                *("--base-url", f"{gemma3_url}/v1", "--max-concurrency", "1"),
            ],
            env=child_env(),
        )
        stderr = tmp_path / "mcp-stderr.log"
        with stderr.open("w") as errlog:
            async with (
                mcp_stdio.stdio_client(parameters, errlog=errlog) as (read_stream, write_stream),
                ClientSession(read_stream, write_stream) as client,
            ):
                await client.initialize()
                asked_noul = await client.call_tool(
                    "ask_noul", {"state": TICKET, "instructions": "Is a refund requested?"}
                )
                asked_choice = await client.call_tool(
                    "ask_choice",
                    {
                        "state": TICKET,
                        "instructions": "Which team?",
                        "options": TEAMS,
                    },
                )
        expected_noul = await direct.judge(TICKET, noul)
        expected_choice = await direct.judge(TICKET, route)
    log = stderr.read_text()
    assert "Traceback" not in log, log
    assert log.rstrip().endswith("stopped"), log  # it closed its session and ended
    answer = structured(asked_noul)
    assert answer["type"] == "noul"
    assert answer["noul"] == pytest.approx(expected_noul["q"].noul, abs=TOLERANCE)  # type: ignore[union-attr]
    assert sum(answer["probabilities"].values()) == pytest.approx(1.0)
    choice = structured(asked_choice)
    assert choice["type"] == "choice"
    want = expected_choice["q"].probabilities
    assert choice["probabilities"] == pytest.approx(dict(want), abs=TOLERANCE)
    assert choice["choice"] in TEAMS


# -- OpenTelemetry --------------------------------------------------------------------------


def _read_spans(otel: Recorded, question: ReadableSpan) -> list[ReadableSpan]:
    return sorted(otel.children(question), key=lambda span: span.start_time or 0)


def _tree(otel: Recorded, root: ReadableSpan, judgment: tv.Judgment) -> dict[str, Any]:
    """A judgment's span tree under ``root``, checked as the telemetry tests check
    llama.cpp's (one read span per read, the i-th escalation's marked i, each escalation an
    event on its question's span), with each level's attribute names."""
    [judge] = otel.children(root)
    assert judge.name == "typevet.judge"
    questions_ = {str(q.attributes["typevet.question.id"]): q for q in otel.children(judge)}  # type: ignore[index]
    assert sorted(questions_) == sorted(judgment.answers)
    reads: dict[str, list[str]] = {}
    for question_id, question in questions_.items():
        diagnostics = judgment.diagnostics[question_id]
        own = _read_spans(otel, question)
        assert len(own) == diagnostics.reads, (question_id, [s.attributes for s in own])
        escalations = [e for e in question.events if e.name == "typevet.escalation"]
        assert len(escalations) == diagnostics.reads - 1, question_id
        for index, read in enumerate(own):
            attributes = read.attributes or {}
            assert read.kind == SpanKind.CLIENT
            assert attributes.get("typevet.read.escalation") == (index or None)
            assert attributes["gen_ai.request.max_tokens"] == 1
            assert int(attributes["gen_ai.usage.input_tokens"]) > 0  # type: ignore[arg-type]
            if index:
                assert escalations[index - 1].attributes is not None
                assert (
                    attributes["typevet.read.top_k"]
                    == (
                        escalations[index - 1].attributes["typevet.read.next_top_k"]  # type: ignore[index]
                    )
                )
        assert (own[-1].attributes or {})["typevet.read.top_k"] == diagnostics.top_k
        reads[question_id] = sorted(set(own[0].attributes or {}) - {"typevet.read.escalation"})
    return {
        "judge": sorted(judge.attributes or {}),
        "questions": {q: sorted(span.attributes or {}) for q, span in questions_.items()},
        "reads": reads,
    }


async def test_its_spans_are_the_llama_cpp_sessions_tree_named_for_it(
    gemma3_url: str, otel: Recorded, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    asked = questions()
    async with (
        OpenAIShapedProxy(gemma3_url, api_key=KEY) as proxy,
        tv.Session.llama_cpp(gemma3_url, max_concurrency=1) as exact,
        tv.Session.openai_compatible(
            f"{proxy.url}/v1", http=tv.HttpSettings(api_key=KEY), max_concurrency=1
        ) as generic,
    ):
        await exact.probe()
        await generic.probe()
        sent_before = len(proxy.requests)
        judgments: dict[str, tv.Judgment] = {}
        for name, session in (("llama.cpp", exact), ("openai-compatible", generic)):
            with trace.get_tracer("app").start_as_current_span(f"app {name}"):
                judgments[name] = await session.judge(TICKET, asked)
    trees = {}
    for name, judgment in judgments.items():
        [root] = [span for span in otel.spans() if span.name == f"app {name}"]
        trees[name] = _tree(otel, root, judgment)
    assert trees["openai-compatible"] == trees["llama.cpp"]

    generic_judgment = judgments["openai-compatible"]
    # On this model the route's options are not all in the top 20: the read widened.
    assert generic_judgment.diagnostics["route"].reads >= 2
    [app] = [span for span in otel.spans() if span.name == "app openai-compatible"]
    [judge] = otel.children(app)
    assert judge.attributes is not None
    assert judge.attributes["gen_ai.provider.name"] == "openai-compatible"
    assert judge.attributes["typevet.usage.reads"] == generic_judgment.usage.reads
    reads = [read for question in otel.children(judge) for read in otel.children(question)]
    for read in reads:
        assert read.attributes is not None
        assert read.attributes["gen_ai.provider.name"] == "openai-compatible"
        assert read.attributes["gen_ai.operation.name"] == "chat"
        assert read.name == f"chat {read.attributes['gen_ai.request.model']}"
        assert read.attributes["server.address"] == "127.0.0.1"
    # Each request the SDK sent carried its own read span's context.
    chats = [headers for path, headers in proxy.requests[sent_before:] if path == CHAT]
    assert len(chats) == len(reads) == generic_judgment.usage.reads
    sent = {headers["traceparent"].split("-")[2] for headers in chats}
    assert sent == {format(read.context.span_id, "016x") for read in reads}
    assert KEY not in everything_recorded(otel, caplog.records)


# -- Retries and Retry-After ----------------------------------------------------------------


@pytest.mark.parametrize("fault", ["http_429", "http_503"])
async def test_a_refusal_with_retry_after_is_retried_after_the_told_delay(
    gemma3_url: str, fault: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with (
        FaultInjectingProxy(gemma3_url, path=CHAT) as proxy,
        tv.Session.openai_compatible(f"{proxy.url}/v1", max_concurrency=1) as session,
    ):
        clean = await session.judge(TICKET, ROUTE)  # the prompt cached, as the read below
        first = len(proxy.paths)
        proxy.retry_after = "2"
        proxy.script = [fault]
        judgment = await session.judge(TICKET, ROUTE)
    assert proxy.seen[-1 - judgment.usage.reads :] == [fault] + ["pass"] * judgment.usage.reads
    diagnostics = judgment.diagnostics["route"]
    assert diagnostics.attempts == diagnostics.reads + 1
    refused, retried = proxy.arrivals[first], proxy.arrivals[first + 1]
    assert proxy.paths[first : first + 2] == [CHAT, CHAT]
    assert retried - refused >= 2.0  # the told delay, not the backoff's quarter second
    [warning] = [record for record in caplog.records if record.name == "typevet_async.retry"]
    assert warning.wait_s == 2.0  # type: ignore[attr-defined]
    assert warning.status == int(fault.removeprefix("http_"))  # type: ignore[attr-defined]
    assert judgment["route"].probabilities == pytest.approx(
        clean["route"].probabilities, abs=TOLERANCE
    )


async def test_an_exhausted_retry_budget_is_the_typed_error_of_the_llama_cpp_session(
    gemma3_url: str,
) -> None:
    """Two retries, then a third 503: the `ServerError` `Session.llama_cpp` gives, naming
    the question, its status and the server's ``Retry-After``."""
    caught: dict[str, tv.ServerError] = {}
    for name, path in (("llama.cpp", "/completion"), ("openai-compatible", CHAT)):
        async with FaultInjectingProxy(gemma3_url, path=path) as proxy:
            session = (
                tv.Session.llama_cpp(proxy.url, http=RETRY_TWICE)
                if name == "llama.cpp"
                else tv.Session.openai_compatible(f"{proxy.url}/v1", http=RETRY_TWICE)
            )
            async with session:
                await session.probe()
                sent = len(proxy.paths)
                proxy.retry_after = "1"
                proxy.script = ["http_503"] * 3
                with pytest.raises(tv.ServerError) as error:
                    await session.judge(TICKET, ROUTE)
            assert proxy.paths[sent:] == [path] * 3  # the first attempt and two retries
            assert proxy.script == []
        caught[name] = error.value
    for error in caught.values():
        assert type(error) is tv.ServerError
        assert (error.status, error.retry_after, error.question_id) == (503, 1.0, "route")
        assert "HTTP 503" in str(error)
    assert str(caught["openai-compatible"]).endswith(str(caught["llama.cpp"]).split(": HTTP")[1])


async def test_a_429_at_the_probes_tokenize_is_retried(gemma3_url: str) -> None:
    """The probe's first ``/tokenize`` (whether the server offers it) meets a 429: retried
    after its ``Retry-After``, not taken for a server without ``/tokenize`` nor failed."""
    async with (
        FaultInjectingProxy(gemma3_url, path="/tokenize") as proxy,
        tv.Session.openai_compatible(f"{proxy.url}/v1") as session,
    ):
        proxy.retry_after = "1"
        proxy.script = ["http_429"]
        probe = await session.probe()
        judgment = await session.judge(TICKET, ROUTE)
    tokenized = [n for n, path in enumerate(proxy.paths) if path == "/tokenize"]
    assert [proxy.seen[n] for n in tokenized[:2]] == ["http_429", "pass"]
    assert proxy.arrivals[tokenized[1]] - proxy.arrivals[tokenized[0]] >= 1.0
    server = probe.chat_server
    assert server is not None
    assert server.tokenize
    assert server.refused == ()
    assert sum(judgment["route"].probabilities.values()) == pytest.approx(1.0)


async def test_a_fleet_reads_elsewhere_while_an_endpoint_says_retry_after(
    gemma3_url: str,
) -> None:
    """Two endpoints of one model, one answering a read 429 with ``Retry-After: 30``: that
    endpoint is out of the rotation for the told time (no read sent to it again), the read is
    answered by the other, at once."""
    async with (
        FaultInjectingProxy(gemma3_url, path=CHAT) as proxy,
        tv.Session.openai_compatible(
            [f"{proxy.url}/v1", f"{gemma3_url}/v1"], max_concurrency=1
        ) as session,
    ):
        await session.probe()
        first = len(proxy.paths)
        proxy.retry_after = "30"
        proxy.script = ["http_429"] * 4  # whichever judgment meets it first
        judgments = [await session.judge(f"{TICKET} ({n})", ROUTE) for n in range(4)]
        states = session.backend.endpoint_states()  # type: ignore[attr-defined]
    chats = [n for n, path in enumerate(proxy.paths) if path == CHAT and n >= first]
    assert [proxy.seen[n] for n in chats] == ["http_429"]  # and nothing after it
    assert states == {f"{proxy.url}/v1": "cooling", f"{gemma3_url}/v1": "up"}
    retried = [j for j in judgments if j.diagnostics["route"].attempts > j.usage.reads]
    assert len(retried) == 1
    for judgment in judgments:
        assert judgment.diagnostics["route"].endpoint == f"{gemma3_url}/v1"
        assert sum(judgment["route"].probabilities.values()) == pytest.approx(1.0)


# -- The API key ----------------------------------------------------------------------------


def stored(folder: Path, pattern: str) -> str:
    """The bytes of the files ``pattern`` matches (a SQLite file and its journals), as text."""
    return b"".join(path.read_bytes() for path in folder.glob(pattern)).decode("latin-1")


#: About 3,000 prompt tokens: more than a slot's 2,048 on the server (an HTTP 400).
TOO_LONG = " ".join(f"sentence {n} about a delayed refund." for n in range(350))


async def test_the_api_key_is_a_bearer_token_and_shown_nowhere_else(
    gemma3_url: str, otel: Recorded, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.DEBUG)
    cache_file = tmp_path / "reads.sqlite"
    schema = {
        "type": "object",
        "properties": {"team": {"enum": TEAMS}},
        "required": ["team"],
        "additionalProperties": False,
    }
    async with (
        OpenAIShapedProxy(gemma3_url, api_key=KEY) as proxy,
        tv.SqliteReadCache(cache_file) as cache,
    ):
        session = tv.Session.openai_compatible(
            f"{proxy.url}/v1",
            http=tv.HttpSettings(api_key=KEY, retry=tv.RetryPolicy(max_retries=0)),
            cache=cache,
        )
        async with session:
            probe = await session.probe()
            judgment = await session.judge(TICKET, questions())
            again = await session.judge(TICKET, questions())  # from the cache
            generation = await session.generate(f"Route: {TICKET}", schema=schema)
            with pytest.raises(tv.ServerError) as too_long:  # the real server's 400
                await session.judge(TOO_LONG, ROUTE)
            identity = session.backend.read_identity()  # type: ignore[attr-defined]
        # A wrong key: refused, the refusal quoting it whole.
        wrong = "sk-proj-WrongKey0000aaaaBBBBcccc"
        async with tv.Session.openai_compatible(
            f"{proxy.url}/v1", http=tv.HttpSettings(api_key=wrong)
        ) as other:
            with pytest.raises(tv.ServerError) as refused:
                await other.judge(TICKET, ROUTE)
        other_shown = repr(other) + repr(other.backend)
    assert all(d.cache == "hit" for d in again.diagnostics.values())
    assert generation.value["team"] in TEAMS
    assert too_long.value.status == 400
    assert refused.value.status == 401
    # Every request of the session carried the key, as a bearer token: the models, the
    # probe's and the judgments' chats, /tokenize at the root.
    mine = [(path, headers) for path, headers in proxy.requests if "authorization" in headers]
    assert len(mine) == len(proxy.requests)
    paths = {path for path, headers in mine if headers["authorization"] == f"Bearer {KEY}"}
    assert {"/v1/models", CHAT, "/tokenize"} <= paths
    assert {h["authorization"] for _, h in mine} == {f"Bearer {KEY}", f"Bearer {wrong}"}

    places = {
        "the logs": "\n".join(f"{record.getMessage()} {vars(record)}" for record in caplog.records),
        "the server's error": shown(too_long.value),
        "the refusal": shown(refused.value),
        "the probe": repr(probe) + str(probe),
        "the session": repr(session) + str(session) + repr(session.backend) + other_shown,
        "the judgment": repr(judgment) + repr(judgment.diagnostics),
        "the telemetry": everything_recorded(otel, []),
        "the read identity": identity,
        "the cache file": stored(tmp_path, "reads.sqlite*"),
    }
    assert places["the cache file"]  # the reads were stored
    assert KEY in json.dumps(proxy.requests)  # sent, so a leak would be seen
    assert "Incorrect API key provided: ***" in refused.value.body  # echoed, then redacted
    leaks = [where for where, text in places.items() if KEY in text or wrong in text]
    assert leaks == []


# -- serve from the command line ------------------------------------------------------------


async def test_serve_from_the_command_line_in_front_of_it(gemma3_url: str) -> None:
    """``typevet-async serve --backend openai_compatible --base-url .../v1 --api-key KEY``
    in a child process: a System One client's judgment read through the upstream's chat
    endpoint with the upstream's key (the gateway's own key is another)."""
    gateway_key = "gateway-key-for-the-system-one-client"
    async with OpenAIShapedProxy(gemma3_url, api_key=KEY) as upstream:
        args = ["--backend", "openai_compatible", "--base-url", f"{upstream.url}/v1"]
        args += ["--api-key", KEY, "--keys-env", "GATEWAY_KEYS"]
        env = child_env(GATEWAY_KEYS=gateway_key)
        gateway = await asyncio.to_thread(GatewayProcess, args, env)
        try:
            await wait_until_ready(gateway.url)  # it probed the upstream
            async with tv.Session.system_one(
                gateway.url, http=tv.HttpSettings(api_key=gateway_key)
            ) as client:
                judgment = await client.judge(TICKET, questions())
        finally:
            await asyncio.to_thread(gateway.stop)
    for question_id in questions():
        answer = judgment[question_id]
        assert sum(answer.probabilities.values()) == pytest.approx(1.0, abs=1e-6), question_id
    chats = [headers for path, headers in upstream.requests if path == CHAT]
    assert chats
    assert {headers["authorization"] for headers in chats} == {f"Bearer {KEY}"}
    assert not [line for line in gateway.lines if KEY in line]
