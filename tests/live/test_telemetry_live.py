"""OpenTelemetry and logs against real servers, recorded by the real OpenTelemetry SDK.

The SDK's providers are installed for each test (`tests.live.telemetry`): its in-memory span
exporter and metric reader see what an application's tracing backend would. The fault proxy
(`tests.live.faults`, the named stub between the SDK and the real llama.cpp server) injects a
transient failure where a test needs a retry, and records the ``traceparent`` header of every
request the SDK sent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import aiohttp
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

import typevet_async as tv
from tests.otel import Recorded, everything_recorded, installed, total

from .faults import FaultInjectingProxy
from .helpers import LETTERED, TICKET
from .otlp import OtlpReceiver
from .servers import VLLM_MODEL_ID

pytestmark = [pytest.mark.live, pytest.mark.asyncio]

#: A marker no attribute, event, status or log record may carry by default.
SECRET = "SECRET-STATE-7f3a"
STATE = f"{SECRET} {TICKET}"
QUESTIONS: dict[str, tv.Question] = {
    "refund": tv.Noul(instructions="Does the customer ask for a refund?"),
    "team": tv.Choice(
        {"billing": None, "shipping": None, "other": None}, instructions="Which team?"
    ),
    "urgency": tv.Score(("low", "medium", "high"), instructions="How urgent is it?"),
}


@pytest.fixture
def otel() -> Iterator[Recorded]:
    with installed() as recorded:
        yield recorded


def _trace_ids(span: ReadableSpan) -> tuple[str, str]:
    return format(span.context.trace_id, "032x"), format(span.context.span_id, "016x")


def _traceparent_parent(header: str | None) -> tuple[str, str]:
    """The trace id and parent span id a ``traceparent`` header names."""
    assert header is not None, "a request went out without a traceparent"
    version, trace_id, span_id, flags = header.split("-")
    assert version == "00", header
    assert int(flags, 16) & 1, header  # sampled
    return trace_id, span_id


async def test_a_three_question_judgment_is_one_span_tree_down_to_each_read(
    gemma3_url: str, otel: Recorded, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="typevet_async")
    async with (
        FaultInjectingProxy(gemma3_url) as proxy,
        # Lettered, no content-free prior: one read a question (a prior's reads are spans too).
        tv.Session.llama_cpp(proxy.url, **LETTERED) as session,
    ):
        await session.probe()
        proxy.traceparents.clear()
        # The application's own span: a web request's, say.
        with trace.get_tracer("app").start_as_current_span("POST /tickets") as request_span:
            judgment = await session.judge(STATE, QUESTIONS)
    [root] = [span for span in otel.spans() if span.name == "POST /tickets"]
    assert root.context.span_id == request_span.get_span_context().span_id
    [judge] = otel.named("typevet.judge")
    assert judge.parent is not None
    assert judge.parent.span_id == root.context.span_id
    assert judge.kind == SpanKind.INTERNAL
    assert judge.status.status_code == StatusCode.UNSET
    assert judge.attributes is not None
    assert judge.attributes["gen_ai.provider.name"] == "llama.cpp"
    assert judge.attributes["typevet.questions"] == 3
    assert judge.attributes["typevet.usage.reads"] == judgment.usage.reads
    assert judge.attributes["gen_ai.usage.input_tokens"] == judgment.usage.prompt_tokens

    questions = otel.children(judge)
    assert sorted(q.attributes["typevet.question.id"] for q in questions) == sorted(QUESTIONS)  # type: ignore[index]
    reads: list[ReadableSpan] = []
    for question in questions:
        attributes = question.attributes
        assert attributes is not None
        question_id = str(attributes["typevet.question.id"])
        diagnostics = judgment.diagnostics[question_id]
        assert attributes["typevet.question.type"] == type(QUESTIONS[question_id]).__name__
        assert attributes["typevet.question.options"] == len(diagnostics.controls)
        assert attributes["typevet.read.attempts"] == diagnostics.attempts
        assert attributes["typevet.off_menu_mass"] == pytest.approx(diagnostics.off_menu_mass)
        assert attributes["typevet.outcome"] == "answered"
        own = otel.children(question)
        assert len(own) == diagnostics.reads >= 1
        for read in own:
            assert read.kind == SpanKind.CLIENT
            assert read.name.startswith("text_completion ")
            read_attributes = read.attributes
            assert read_attributes is not None
            assert read_attributes["gen_ai.operation.name"] == "text_completion"
            assert read_attributes["gen_ai.provider.name"] == "llama.cpp"
            assert read_attributes["server.address"] == "127.0.0.1"
            assert int(read_attributes["gen_ai.usage.input_tokens"]) > 0  # type: ignore[arg-type]
        reads += own
    # Every request the SDK sent carried its read span's context: the model server's side of
    # the trace hangs under the read, in the application's trace.
    assert len(proxy.traceparents) == len(reads) == judgment.usage.reads
    trace_id = format(root.context.trace_id, "032x")
    sent = {_traceparent_parent(header) for header in proxy.traceparents}
    assert sent == {(trace_id, _trace_ids(read)[1]) for read in reads}

    points = otel.metrics()
    assert total(points["typevet.reads"]) == judgment.usage.reads
    assert total(points["gen_ai.client.operation.duration"]) == judgment.usage.reads
    assert total(points["typevet.judgment.duration"]) == 1
    assert "typevet.errors" not in points
    [token_point] = points["gen_ai.client.token.usage"]
    assert token_point.attributes["gen_ai.token.type"] == "input"
    assert token_point.sum == judgment.usage.prompt_tokens
    # One DEBUG record per question, with its structured fields.
    asked = [r for r in caplog.records if r.name == "typevet_async.question"]
    assert sorted(r.question_id for r in asked) == sorted(QUESTIONS)  # type: ignore[attr-defined]
    assert all(r.status == "answered" and r.duration_ms > 0 for r in asked)  # type: ignore[attr-defined]
    # And one per HTTP read, with its tokens.
    http_reads = [r for r in caplog.records if r.name == "typevet_async.read" and r.levelno == 10]
    assert len(http_reads) == judgment.usage.reads
    assert sum(r.input_tokens for r in http_reads) == judgment.usage.prompt_tokens  # type: ignore[attr-defined]
    # No state text anywhere by default.
    recorded = everything_recorded(otel, caplog.records)
    assert SECRET not in recorded
    assert "charged twice" not in recorded


async def test_a_retried_read_shows_its_retry_and_sends_each_attempt_in_the_trace(
    gemma3_url: str, otel: Recorded, caplog: pytest.LogCaptureFixture
) -> None:
    question = {"refund": QUESTIONS["refund"]}
    async with (
        FaultInjectingProxy(gemma3_url) as proxy,
        tv.Session.llama_cpp(proxy.url) as session,
    ):
        await session.probe()
        proxy.traceparents.clear()
        proxy.script = ["http_503"]
        judgment = await session.judge(STATE, question)
    assert "http_503" in proxy.seen
    diagnostics = judgment.diagnostics["refund"]
    assert diagnostics.attempts == diagnostics.reads + 1  # one retry (and any escalation)
    [question_span] = otel.named("typevet.question")
    reads = sorted(otel.children(question_span), key=lambda span: span.start_time or 0)
    assert len(reads) == diagnostics.reads
    first = reads[0]
    assert first.attributes is not None
    assert first.status.status_code == StatusCode.UNSET
    [retry] = [event for event in first.events if event.name == "typevet.retry"]
    assert retry.attributes is not None
    assert retry.attributes["error.type"] == "ServerError"
    assert retry.attributes["http.response.status_code"] == 503
    assert retry.attributes["typevet.attempt"] == 1
    assert not [event for read in reads[1:] for event in read.events]
    # Both attempts of the first read went out under its span, each later read under its own.
    expected = [_trace_ids(first)] * 2 + [_trace_ids(read) for read in reads[1:]]
    assert [_traceparent_parent(h) for h in proxy.traceparents] == expected
    points = otel.metrics()
    [retried] = points["typevet.retries"]
    assert retried.value == 1
    assert retried.attributes["error.type"] == "ServerError"
    [warning] = [r for r in caplog.records if r.name == "typevet_async.retry"]
    assert warning.levelno == logging.WARNING
    assert warning.attempts == 1
    assert warning.status == 503
    assert warning.error_type == "ServerError"  # type: ignore[attr-defined]


async def test_an_escalated_read_is_a_second_read_span_under_its_question(
    gemma3_url: str, otel: Recorded, caplog: pytest.LogCaptureFixture
) -> None:
    # A top-2 first read misses a candidate of Gemma's (its top two are other tokens).
    async with tv.Session.llama_cpp(gemma3_url, top_k=2) as session:
        judgment = await session.judge(STATE, {"team": QUESTIONS["team"]})
    diagnostics = judgment.diagnostics["team"]
    assert diagnostics.reads == 2, "the read was expected to escalate once"
    [question_span] = otel.named("typevet.question")
    first, second = sorted(otel.children(question_span), key=lambda span: span.start_time or 0)
    assert first.attributes is not None
    assert second.attributes is not None
    assert first.attributes["typevet.read.top_k"] == 2
    assert "typevet.read.escalation" not in first.attributes
    assert second.attributes["typevet.read.top_k"] == diagnostics.top_k > 2
    assert second.attributes["typevet.read.escalation"] == 1
    assert question_span.attributes is not None
    assert question_span.attributes["typevet.read.escalations"] == 1
    [escalation] = [e for e in question_span.events if e.name == "typevet.escalation"]
    assert escalation.attributes is not None
    assert escalation.attributes["typevet.read.top_k"] == 2
    assert escalation.attributes["typevet.read.next_top_k"] == diagnostics.top_k
    points = otel.metrics()
    assert total(points["typevet.escalations"]) == 1
    assert total(points["typevet.reads"]) == 2
    [warning] = [r for r in caplog.records if r.name == "typevet_async.read" and r.levelno == 30]
    assert warning.levelno == logging.WARNING
    assert warning.top_k == 2
    assert warning.next_top_k == diagnostics.top_k


async def test_a_failed_judgment_marks_its_spans_failed_by_error_type_only(
    gemma3_url: str, otel: Recorded
) -> None:
    async with (
        FaultInjectingProxy(gemma3_url) as proxy,
        tv.Session.llama_cpp(
            proxy.url, http=tv.HttpSettings(retry=tv.RetryPolicy(max_retries=0))
        ) as session,
    ):
        await session.probe()
        proxy.script = ["duplicated_id"]  # a reply that fails validation: not retried
        with pytest.raises(tv.TypevetError) as caught:
            await session.judge(STATE, {"refund": QUESTIONS["refund"]})
    kind = type(caught.value).__name__
    assert isinstance(caught.value, tv.InvalidLogprobsError), kind
    [judge] = otel.named("typevet.judge")
    [question_span] = otel.children(judge)
    # The HTTP read itself succeeded; its reply failed validation, the question's step.
    [read] = otel.children(question_span)
    assert read.status.status_code == StatusCode.UNSET
    for span in (judge, question_span):
        assert span.status.status_code == StatusCode.ERROR
        assert span.attributes is not None
        assert span.attributes["error.type"] == kind
        # The type, never the message (a message may quote the server's reply).
        assert span.status.description == kind
        assert not span.events
    points = otel.metrics()
    [failed] = points["typevet.errors"]
    assert failed.value == 1
    assert failed.attributes["error.type"] == kind
    assert failed.attributes["typevet.operation"] == "judge"
    assert SECRET not in everything_recorded(otel, [])


async def test_with_no_provider_nothing_is_recorded_and_no_traceparent_is_sent(
    gemma3_url: str,
) -> None:
    async with (
        FaultInjectingProxy(gemma3_url) as proxy,
        tv.Session.llama_cpp(proxy.url) as session,
    ):
        judgment = await session.judge(STATE, {"refund": QUESTIONS["refund"]})
    assert judgment["refund"].noul is not None  # type: ignore[union-attr]
    assert proxy.traceparents
    assert set(proxy.traceparents) == {None}


async def test_a_generation_is_a_chat_span_with_its_token_usage(
    gemma3_url: str, otel: Recorded
) -> None:
    schema = {"enum": ["billing", "shipping"]}
    async with tv.Session.llama_cpp(gemma3_url) as session:
        generation = await session.generate(
            f"Which team handles this ticket, billing or shipping? {TICKET}",
            schema=schema,
            max_tokens=32,
        )
    [span] = otel.named("chat")
    assert span.kind == SpanKind.CLIENT
    assert span.attributes is not None
    assert span.attributes["gen_ai.operation.name"] == "chat"
    assert span.attributes["gen_ai.request.max_tokens"] == 32
    assert span.attributes["gen_ai.usage.input_tokens"] == generation.prompt_tokens
    assert span.attributes["gen_ai.usage.output_tokens"] == generation.completion_tokens
    assert span.attributes["gen_ai.response.finish_reasons"] == (generation.finish_reason,)
    assert "charged twice" not in json.dumps(dict(span.attributes))


async def test_the_gateway_joins_the_callers_trace_down_to_the_model_servers_read(
    gemma3_url: str, otel: Recorded
) -> None:
    from opentelemetry import propagate

    from typevet_async._apps.gateway import GatewayConfig, running

    question = {"type": "noul", "instructions": "Is a refund requested?"}
    body = {"model": "gemma-3-270m", "state": STATE, "questions": {"refund": question}}
    async with (
        FaultInjectingProxy(gemma3_url) as proxy,
        running(tv.Session.llama_cpp(proxy.url), GatewayConfig()) as gateway,
        aiohttp.ClientSession() as http,
    ):
        # The caller: a web app's handler with its own span, sending its trace context.
        with trace.get_tracer("app").start_as_current_span("POST /tickets"):
            headers: dict[str, str] = {}
            propagate.inject(headers)
            async with http.post(f"{gateway}/v1/systemone", json=body, headers=headers) as reply:
                assert reply.status == 200, await reply.text()
    [caller] = [span for span in otel.spans() if span.name == "POST /tickets"]
    [server] = otel.named("POST /v1/systemone")
    assert server.kind == SpanKind.SERVER
    assert server.parent is not None
    assert server.parent.span_id == caller.context.span_id
    assert server.context.trace_id == caller.context.trace_id
    assert server.attributes is not None
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["http.route"] == "/v1/systemone"
    [judge] = otel.named("typevet.judge")
    assert judge.parent is not None
    assert judge.parent.span_id == server.context.span_id
    [question_span] = otel.children(judge)
    reads = otel.children(question_span)
    assert reads
    # The read the model server answered is in the caller's trace, under its read span.
    trace_id = format(caller.context.trace_id, "032x")
    read_ids = {(trace_id, _trace_ids(read)[1]) for read in reads}
    scored = [
        h for h, path in zip(proxy.traceparents, proxy.paths, strict=True) if path == "/completion"
    ]
    assert {_traceparent_parent(h) for h in scored} == read_ids
    assert SECRET not in everything_recorded(otel, [])


@pytest.mark.parametrize("forward", [False, True])
async def test_the_callers_tracestate_and_baggage_reach_the_model_server_only_if_forwarded(
    gemma3_url: str, otel: Recorded, forward: bool
) -> None:
    from typevet_async._apps.gateway import GatewayConfig, running

    question = {"type": "noul", "instructions": "Is a refund requested?"}
    body = {"model": "gemma-3-270m", "state": STATE, "questions": {"refund": question}}
    caller = {
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "tracestate": "vendor=caller-chosen",
        "baggage": "customer.email=someone%40example.com",
    }
    config = GatewayConfig(forward_tracestate_baggage=forward)
    async with (
        FaultInjectingProxy(gemma3_url) as proxy,
        running(tv.Session.llama_cpp(proxy.url), config) as gateway,
        aiohttp.ClientSession() as http,
        http.post(f"{gateway}/v1/systemone", json=body, headers=caller) as reply,
    ):
        assert reply.status == 200, await reply.text()
    scored = [
        h for h, path in zip(proxy.trace_headers, proxy.paths, strict=True) if path == "/completion"
    ]
    assert scored
    for headers in scored:  # each read joined the caller's trace
        assert headers["traceparent"].split("-")[1] == "4bf92f3577b34da6a3ce929d0e0e4736"
    forwarded = {(h.get("tracestate"), h.get("baggage")) for h in scored}
    # before the setting: always forwarded
    expected = (caller["tracestate"], caller["baggage"]) if forward else (None, None)
    assert forwarded == {expected}


async def test_an_mcp_tool_call_joins_the_agents_trace(gemma3_url: str, otel: Recorded) -> None:
    import mcp

    from typevet_async._apps import mcp as _mcp

    async with mcp.Client(
        _mcp.build_server(tv.Session.llama_cpp(gemma3_url)), mode="legacy"
    ) as client:
        with trace.get_tracer("agent").start_as_current_span("agent turn"):
            result = await client.call_tool(
                "ask_noul", {"state": STATE, "instructions": "Is a refund requested?"}
            )
    assert not result.is_error
    [agent] = [span for span in otel.spans() if span.name == "agent turn"]
    [server] = [
        s for s in otel.spans() if s.kind == SpanKind.SERVER and s.name == "tools/call ask_noul"
    ]
    assert server.context.trace_id == agent.context.trace_id
    [judge] = otel.named("typevet.judge")
    assert judge.parent is not None
    assert judge.parent.span_id == server.context.span_id
    [question_span] = otel.children(judge)
    assert otel.children(question_span)
    assert SECRET not in everything_recorded(otel, [])


async def test_vllms_own_read_span_joins_the_callers_trace_under_the_sdks_read(
    vllm_url: str, otlp_receiver: OtlpReceiver, otel: Recorded
) -> None:
    async with tv.Session.vllm(vllm_url, model=VLLM_MODEL_ID) as session:
        await session.probe()
        with trace.get_tracer("app").start_as_current_span("POST /tickets") as request_span:
            judgment = await session.judge(STATE, {"refund": QUESTIONS["refund"]})
    assert judgment.usage.reads == 1
    [read] = [span for span in otel.spans() if span.kind == SpanKind.CLIENT]
    assert read.name == f"chat {VLLM_MODEL_ID}"
    assert read.attributes is not None
    assert read.attributes["gen_ai.provider.name"] == "vllm"
    assert read.attributes["gen_ai.usage.input_tokens"] == judgment.usage.prompt_tokens
    trace_id = format(request_span.get_span_context().trace_id, "032x")
    # vLLM exports its span a moment later (its batch exporter, every 0.5 s here).
    [served] = otlp_receiver.wait_for(trace_id)
    assert served.name == "llm_request"
    assert served.parent_span_id == _trace_ids(read)[1]
    assert served.attributes["gen_ai.usage.prompt_tokens"] == judgment.usage.prompt_tokens


async def test_a_cached_read_is_a_question_span_with_no_read_under_it(
    gemma3_url: str, otel: Recorded
) -> None:
    question = {"refund": QUESTIONS["refund"]}
    async with tv.Session.llama_cpp(gemma3_url, cache=tv.MemoryReadCache()) as session:
        fresh = await session.judge(STATE, question)
        otel.exporter.clear()
        otel.metrics()  # the first judgment's points, read and dropped (delta temporality)
        again = await session.judge(STATE, question)
    assert again.usage.reads == 0
    assert again.usage.cache_hits == 1
    assert again["refund"] == fresh["refund"]
    [judge] = otel.named("typevet.judge")
    assert judge.attributes is not None
    assert judge.attributes["typevet.cache.hits"] == 1
    assert judge.attributes["typevet.usage.reads"] == 0
    [question_span] = otel.children(judge)
    assert question_span.attributes is not None
    assert question_span.attributes["typevet.cache"] == "hit"
    assert not otel.children(question_span)  # nothing was sent
    points = otel.metrics()
    [lookup] = points["typevet.cache.lookups"]
    assert lookup.value == 1
    assert lookup.attributes["typevet.cache.outcome"] == "hit"
    assert "typevet.reads" not in points
