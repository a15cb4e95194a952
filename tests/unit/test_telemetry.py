"""`typevet_async._telemetry` without a server: what it does with no provider installed (the
hot path: nothing), with the real OpenTelemetry SDK's providers installed, and the command
line's log flags. The span trees of real judgments are tests/live/test_telemetry_live.py's."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

import typevet_async as tv
import typevet_async._telemetry as telemetry
from tests.otel import Recorded, installed
from typevet_async._apps.cli.logs import configure_logging, logging_flags
from typevet_async._errors import ServerError


@pytest.fixture
def otel() -> Iterator[Recorded]:
    with installed() as recorded:
        yield recorded


def test_with_no_provider_nothing_is_built_and_headers_pass_through() -> None:
    assert not telemetry.active()
    assert not telemetry.observing()
    with telemetry.read_span("text_completion", "llama.cpp", "m", "http://h:1", top_k=64) as span:
        assert span is None
    with telemetry.generation_span("llama.cpp", "m", None, 16) as generation:
        assert generation is None
    headers = {"Content-Type": "application/json"}
    assert telemetry.with_trace_context(headers) is headers  # not even copied
    assert telemetry.with_trace_context(None) is None


def test_debug_logs_alone_time_the_reads_without_spans(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="typevet_async")
    assert telemetry.observing()
    assert not telemetry.active()
    with telemetry.read_span("chat", "vllm", "m", "http://h:1", top_k=3) as span:
        assert span is not None
        telemetry.read_usage(span, 12, 4)  # recorded nowhere: no provider


def test_a_read_span_sends_its_context_and_records_its_metrics(otel: Recorded) -> None:
    with telemetry.read_span(
        "text_completion", "llama.cpp", "gemma", "http://127.0.0.1:8080", top_k=64, escalation=1
    ) as span:
        assert span is not None
        headers = telemetry.with_trace_context({"Content-Type": "application/json"})
        telemetry.read_usage(span, 40, 39)
    [read] = otel.spans()
    assert read.name == "text_completion gemma"
    assert read.kind == SpanKind.CLIENT
    assert headers is not None
    assert headers["Content-Type"] == "application/json"
    assert headers["traceparent"].split("-")[2] == format(read.context.span_id, "016x")
    assert dict(read.attributes or {}) == {
        "gen_ai.operation.name": "text_completion", "gen_ai.provider.name": "llama.cpp",
        "gen_ai.request.model": "gemma", "server.address": "127.0.0.1", "server.port": 8080,
        "typevet.read.top_k": 64, "gen_ai.request.max_tokens": 1, "typevet.read.escalation": 1,
        "gen_ai.usage.input_tokens": 40, "gen_ai.usage.cache_read.input_tokens": 39,
        "gen_ai.usage.output_tokens": 0,
    }  # fmt: skip
    points = otel.metrics()
    [reads] = points["typevet.reads"]
    assert reads.value == 1
    [in_flight] = points["typevet.reads.in_flight"]
    assert in_flight.value == 0  # up, then down again


def test_the_instrumentation_scope_is_named_with_the_package_version(otel: Recorded) -> None:
    with telemetry.read_span("chat", "vllm", "m", "http://h:1", top_k=3):
        pass
    [read] = otel.spans()
    scope = read.instrumentation_scope
    assert scope is not None
    assert (scope.name, scope.version) == ("typevet_async", tv.__version__)


def test_a_failure_is_its_type_never_its_message(otel: Recorded) -> None:
    with (
        pytest.raises(ServerError),
        telemetry.read_span("chat", "vllm", None, "https://h", top_k=2),
    ):
        raise ServerError("HTTP 500: SECRET-1", status=500, body="SECRET-1")
    [read] = otel.spans()
    assert read.name == "chat"
    assert read.status.status_code == StatusCode.ERROR
    assert read.status.description == "ServerError"
    assert (read.attributes or {})["error.type"] == "ServerError"
    assert (read.attributes or {})["server.port"] == 443
    assert not read.events
    [duration] = otel.metrics()["gen_ai.client.operation.duration"]
    assert duration.attributes["error.type"] == "ServerError"


def test_a_retry_is_an_event_a_count_and_a_warning(
    otel: Recorded, caplog: pytest.LogCaptureFixture
) -> None:
    with trace.get_tracer("t").start_as_current_span("read"):
        telemetry.retried(1, ServerError("HTTP 503 SECRET-2", status=503, body="SECRET-2"), 0.25)
    [span] = otel.spans()
    [event] = span.events
    assert event.name == "typevet.retry"
    assert dict(event.attributes or {}) == {
        "typevet.attempt": 1, "error.type": "ServerError", "typevet.wait_s": 0.25,
        "http.response.status_code": 503,
    }  # fmt: skip
    [warning] = caplog.records
    assert warning.name == "typevet_async.retry"
    assert warning.levelno == logging.WARNING
    assert "SECRET-2" not in warning.getMessage()
    assert otel.metrics()["typevet.retries"][0].value == 1


def test_a_store_the_read_cache_failed_is_counted_by_its_type(otel: Recorded) -> None:
    telemetry.cache_store_failed(3, "OperationalError")
    telemetry.cache_store_failed(1, "OSError")
    points = otel.metrics()["typevet.cache.store_failures"]
    assert sorted((p.attributes["error.type"], p.value) for p in points) == [
        ("OSError", 1), ("OperationalError", 3),
    ]  # fmt: skip


def test_the_gateways_server_span_joins_the_incoming_trace(otel: Recorded) -> None:
    carrier = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    with telemetry.server_span(
        "POST /v1/systemone", carrier, {"http.route": "/v1/systemone"}
    ) as span:
        assert span is not None
        span.failed_as("503")
    [server] = otel.spans()
    assert server.kind == SpanKind.SERVER
    assert format(server.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    assert server.parent is not None
    assert format(server.parent.span_id, "016x") == "b7ad6b7169203331"
    assert server.status.status_code == StatusCode.ERROR


def _parsed(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    logging_flags(parser)
    return parser.parse_args(argv)


@contextlib.contextmanager
def bare_root_logger() -> Iterator[None]:
    """No handler on the root logger for the block (pytest's own capture handlers are put
    back after), and the levels as they were."""
    root = logging.getLogger()
    kept, level = root.handlers[:], root.level
    ours = logging.getLogger("typevet_async")
    our_level = ours.level
    root.handlers.clear()
    try:
        yield
    finally:
        for handler in root.handlers:
            if handler not in kept:
                handler.close()
        root.handlers[:] = kept
        root.setLevel(level)
        ours.setLevel(our_level)


def test_log_format_json_writes_one_object_per_record_with_its_fields(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stderr = io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    with bare_root_logger():
        configure_logging(_parsed(["-vv", "--log-format", "json"]))
        logging.getLogger("typevet_async.read").debug(
            "question %r answered", "refund", extra={"question_id": "refund", "attempts": 2}
        )
        logging.getLogger("other.library").info("not ours, below the root's WARNING")
    [line] = stderr.getvalue().splitlines()
    record = json.loads(line)
    assert record["level"] == "DEBUG"
    assert record["name"] == "typevet_async.read"
    assert record["message"] == "question 'refund' answered"
    assert record["question_id"] == "refund"
    assert record["attempts"] == 2


@pytest.mark.parametrize(
    ("argv", "default", "level"),
    [([], logging.WARNING, logging.WARNING), (["-v"], logging.WARNING, logging.INFO),
     (["-vvv"], logging.WARNING, logging.DEBUG), ([], logging.INFO, logging.INFO)],
)  # fmt: skip
def test_each_v_lowers_the_level(argv: list[str], default: int, level: int) -> None:
    with bare_root_logger():
        configure_logging(_parsed(argv), default=default)
        assert logging.getLogger("typevet_async").level == level


def test_a_program_that_configured_logging_itself_keeps_its_own() -> None:
    ours = logging.getLogger("typevet_async")
    before = ours.level
    with bare_root_logger():
        logging.getLogger().addHandler(handler := logging.NullHandler())
        configure_logging(_parsed(["-vv"]))
        assert ours.level == before
        assert logging.getLogger().handlers == [handler]


#: A judgment and the span helpers with the ``otel`` extra absent (every import of
#: ``opentelemetry`` fails) and DEBUG logs on: the records still come, nothing else is needed.
_WITHOUT_OPENTELEMETRY = """
import asyncio, io, logging, sys
sys.modules["opentelemetry"] = None
import typevet_async as tv
import typevet_async._telemetry as telemetry
from tests.unit.stubs import InMemoryStubBackend
assert not telemetry.active()
stream = io.StringIO()
logging.basicConfig(level=logging.DEBUG, stream=stream, format="%(name)s %(message)s")
async def main():
    async with tv.Session(InMemoryStubBackend()) as session:
        judgment = await session.judge("a ticket", {"q": tv.Noul(instructions="Refund?")})
    assert judgment["q"].noul is not None
asyncio.run(main())
with telemetry.read_span("text_completion", "llama.cpp", "m", "http://h:1", top_k=4) as span:
    telemetry.read_usage(span, 10, 2)
telemetry.retried(1, RuntimeError("x"), 0.1)
telemetry.escalated(4, 64, 1)
assert "opentelemetry" not in {name.split(".")[0] for name in sys.modules if sys.modules[name]}
print(stream.getvalue())
"""


def test_without_the_otel_extra_debug_logs_still_time_every_step() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_OPENTELEMETRY],
        capture_output=True, text=True, timeout=120, check=False,
        cwd=Path(__file__).parent.parent.parent,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    names = [line.split(" ", 1)[0] for line in done.stdout.splitlines() if line]
    assert "typevet_async.question" in names
    assert "typevet_async.judgment" in names
    assert "typevet_async.read" in names
    assert "typevet_async.retry" in names
