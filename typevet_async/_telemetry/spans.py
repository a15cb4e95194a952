"""The spans of a judgment, its questions, each read and each generation (with their
metrics and DEBUG log records), and the `Span` wrapper the pipelines set results on."""

from __future__ import annotations

import logging
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from typevet_async._telemetry.instruments import (
    CAPTURE_CONTENT,
    OTEL,
    instruments,
    judgment_log,
    observing,
    question_log,
    read_log,
    tracing,
)

if TYPE_CHECKING:
    from typevet_async._core.prompts.scoring import ScoringRequest
    from typevet_async._core.reading.answers import Diagnostics, Judgment

if OTEL:
    from opentelemetry.trace import SpanKind as _SpanKind
    from opentelemetry.trace import Status as _Status
    from opentelemetry.trace import StatusCode as _StatusCode
else:

    class _SpanKind:  # type: ignore[no-redef]
        """Without OpenTelemetry no span is started: the kinds are never read (DEBUG logs
        alone still time the reads)."""

        INTERNAL = CLIENT = SERVER = None


__all__ = [
    "Span",
    "answered",
    "error_type",
    "generated",
    "generation_span",
    "judged",
    "judgment_span",
    "question_span",
    "read_span",
    "read_usage",
    "server_attributes",
    "traced_span",
]


class _NoSpan:
    """What a `Span` wraps without a tracer provider: nothing is recorded."""

    def set_attribute(self, name: str, value: Any) -> None:
        pass

    def set_status(self, status: Any) -> None:
        pass

    def record_exception(self, error: BaseException) -> None:
        pass


_NO_SPAN = _NoSpan()


def error_type(error: BaseException) -> str:
    """``error.type``: the exception's class name (its message may quote a reply)."""
    return type(error).__name__


@lru_cache(maxsize=64)
def server_attributes(base_url: str | None) -> Mapping[str, Any]:
    """``server.address`` and ``server.port`` of a base URL (no credentials, no path)."""
    if not base_url:
        return {}
    parts = urllib.parse.urlsplit(base_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return {"server.address": parts.hostname or "", "server.port": port}


class Span:
    """One span under construction, and what its metrics and log record need: a thin wrapper
    so the pipelines set results without importing OpenTelemetry."""

    __slots__ = ("_span", "attributes", "fields", "started")

    def __init__(self, span: Any, attributes: dict[str, Any]) -> None:
        self._span = span
        #: The low-cardinality attributes its metrics are recorded under.
        self.attributes = attributes
        #: What its log record adds (counts, tokens: too many values for a metric attribute).
        self.fields: dict[str, Any] = {}
        self.started = time.perf_counter()

    def set(self, name: str, value: Any) -> None:
        if value is not None:
            self._span.set_attribute(name, value)

    def fail(self, error: BaseException) -> None:
        """Mark the span failed by ``error``'s type (its message only with content opted in)."""
        self.failed_as(error_type(error), str(error) if CAPTURE_CONTENT else None)
        if CAPTURE_CONTENT:
            self._span.record_exception(error)

    def failed_as(self, kind: str, description: str | None = None) -> None:
        """Mark the span failed: ``error.type`` ``kind``, status ERROR."""
        self.attributes["error.type"] = kind
        if self._span is _NO_SPAN:
            return
        self._span.set_attribute("error.type", kind)
        self._span.set_status(_Status(_StatusCode.ERROR, description or kind))

    def elapsed(self) -> float:
        return time.perf_counter() - self.started


@contextmanager
def traced_span(
    name: str,
    kind: Any,
    attributes: dict[str, Any],
    metric_attributes: dict[str, Any],
    on_end: Callable[[Span], None] | None = None,
) -> Iterator[Span]:
    """A span made current for the block; an exception marks it failed (by type) and goes on;
    ``on_end`` records its metrics and log once its outcome is known."""
    with (
        instruments().tracer.start_as_current_span(
            name,
            kind=kind,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        )
        if tracing()
        else nullcontext(_NO_SPAN)
    ) as raw:
        span = Span(raw, metric_attributes)
        try:
            yield span
        except BaseException as error:
            span.fail(error)
            raise
        finally:
            if on_end is not None:
                on_end(span)


@contextmanager
def judgment_span(
    provider: str, model: str | None, questions: int, state_text: str
) -> Iterator[Span]:
    """The span of one judgment (``typevet.judge``), its duration and, if it fails, its error
    counted; a DEBUG log record at the end."""
    common: dict[str, Any] = {"gen_ai.provider.name": provider}
    if model:
        common["gen_ai.request.model"] = model
    attributes = {**common, "typevet.questions": questions}
    if CAPTURE_CONTENT:
        attributes["typevet.state"] = state_text

    def end(span: Span) -> None:
        recorders = instruments()
        elapsed = span.elapsed()
        recorders.judgment_duration.record(elapsed, span.attributes)
        failed = span.attributes.get("error.type")
        if failed is not None:
            recorders.errors.add(1, {**span.attributes, "typevet.operation": "judge"})
        if judgment_log.isEnabledFor(logging.DEBUG):
            judgment_log.debug(
                "judgment of %d question(s) %s in %.1f ms",
                questions,
                failed or "ok",
                elapsed * 1000,
                extra={
                    "questions": questions,
                    "status": failed or "ok",
                    "duration_ms": round(elapsed * 1000, 3),
                },
            )

    with traced_span("typevet.judge", _SpanKind.INTERNAL, attributes, common, end) as span:
        yield span


def judged(span: Span, judgment: Judgment) -> None:
    """A judgment's totals on its span."""
    usage = judgment.usage
    span.set("typevet.usage.reads", usage.reads)
    span.set("gen_ai.usage.input_tokens", usage.prompt_tokens)
    span.set("gen_ai.usage.cache_read.input_tokens", usage.cached_tokens)
    span.set("typevet.cache.hits", usage.cache_hits)


@contextmanager
def question_span(request: ScoringRequest) -> Iterator[Span]:
    """The span of one question's read (``typevet.question``; one per rotation, when the
    options are read under several)."""
    question = request.question
    attributes: dict[str, Any] = {
        "typevet.question.id": request.question_id,
        "typevet.question.type": type(question).__name__,
        "typevet.question.options": len(request.controls),
    }
    if request.order:
        attributes["typevet.question.rotation"] = request.order[0]

    def end(span: Span) -> None:
        if question_log.isEnabledFor(logging.DEBUG):
            elapsed = span.elapsed()
            failed = span.attributes.get("error.type")
            question_log.debug(
                "question %r %s in %.1f ms",
                request.question_id,
                failed or span.attributes.get("typevet.outcome", "ok"),
                elapsed * 1000,
                extra={
                    "question_id": request.question_id,
                    "status": failed or span.attributes.get("typevet.outcome", "ok"),
                    "attempts": span.attributes.get("typevet.read.attempts"),
                    "reads": span.attributes.get("typevet.read.reads"),
                    "duration_ms": round(elapsed * 1000, 3),
                },
            )

    with traced_span("typevet.question", _SpanKind.INTERNAL, attributes, {}, end) as span:
        yield span


def answered(span: Span, request: ScoringRequest, diagnostics: Diagnostics) -> None:
    """A question's read on its span: reads, attempts, escalations, off-menu mass, outcome;
    an off-menu trip counted."""
    span.set("typevet.read.top_k", diagnostics.top_k)
    span.set("typevet.read.reads", diagnostics.reads)
    span.set("typevet.read.attempts", diagnostics.attempts)
    span.attributes["typevet.read.reads"] = diagnostics.reads
    # Every read past the first is an escalation, but a code question's reads after each
    # distinct first token (`typevet_async._core.prompts.codes`).
    after = len({first for first, _ in diagnostics.codes})
    span.set("typevet.read.escalations", max(diagnostics.reads - 1 - after, 0))
    span.attributes["typevet.read.attempts"] = diagnostics.attempts
    span.set("typevet.off_menu_mass", diagnostics.off_menu_mass)
    if diagnostics.cache is not None:  # the read cache's outcome, counted
        span.set("typevet.cache", diagnostics.cache)
        instruments().cache.add(1, {"typevet.cache.outcome": diagnostics.cache})
    if diagnostics.endpoint is not None:
        span.set("typevet.endpoint", diagnostics.endpoint)
    if CAPTURE_CONTENT:
        span.set("typevet.prompt", diagnostics.prompt)
    outcome = "answered"
    if diagnostics.off_menu_flagged:
        outcome = "off_menu"
        instruments().off_menu.add(1, {"typevet.question.type": type(request.question).__name__})
    span.set("typevet.outcome", outcome)
    span.attributes["typevet.outcome"] = outcome


def read_span(
    operation: str,
    provider: str,
    model: str | None,
    base_url: str | None,
    *,
    top_k: int,
    escalation: int = 0,
) -> AbstractContextManager[Span | None]:
    """`_read_span` where telemetry or DEBUG logs are on (`observing`); else a context that
    does nothing and gives None (the hot path)."""
    if not observing():
        return nullcontext(None)
    return _read_span(operation, provider, model, base_url, top_k, escalation)


@contextmanager
def _read_span(
    operation: str,
    provider: str,
    model: str | None,
    base_url: str | None,
    top_k: int,
    escalation: int,
) -> Iterator[Span]:
    """The span of one HTTP scoring read (CLIENT: ``{operation} {model}``), the GenAI
    duration metric, the read counted and in flight while it runs. The HTTP client sends the
    span's trace context with the request (`with_trace_context`)."""
    recorders = instruments()
    common: dict[str, Any] = {
        "gen_ai.operation.name": operation,
        "gen_ai.provider.name": provider,
        **server_attributes(base_url),
    }
    if model:
        common["gen_ai.request.model"] = model
    attributes = {**common, "typevet.read.top_k": top_k, "gen_ai.request.max_tokens": 1}
    if escalation:
        attributes["typevet.read.escalation"] = escalation
    in_flight = {"gen_ai.provider.name": provider}

    def end(span: Span) -> None:
        elapsed = span.elapsed()
        recorders.in_flight.add(-1, in_flight)
        recorders.operation_duration.record(elapsed, span.attributes)
        recorders.reads.add(1, span.attributes)
        if read_log.isEnabledFor(logging.DEBUG):
            failed = span.attributes.get("error.type")
            read_log.debug(
                "read of the top %d %s in %.1f ms",
                top_k,
                failed or "ok",
                elapsed * 1000,
                extra={
                    "status": failed or "ok",
                    "top_k": top_k,
                    "escalation": escalation,
                    "duration_ms": round(elapsed * 1000, 3),
                    **span.fields,
                },
            )

    recorders.in_flight.add(1, in_flight)
    name = f"{operation} {model}" if model else operation
    with traced_span(name, _SpanKind.CLIENT, attributes, common, end) as span:
        yield span


def read_usage(span: Span, prompt_tokens: int, cached_tokens: int) -> None:
    """A read's (or generation's input) token usage on its span and in the token histogram."""
    span.set("gen_ai.usage.input_tokens", prompt_tokens)
    span.set("gen_ai.usage.cache_read.input_tokens", cached_tokens)
    span.set("gen_ai.usage.output_tokens", 0)
    span.fields["input_tokens"], span.fields["cached_tokens"] = prompt_tokens, cached_tokens
    instruments().token_usage.record(
        prompt_tokens, {**span.attributes, "gen_ai.token.type": "input"}
    )


def generation_span(
    provider: str, model: str | None, base_url: str | None, max_tokens: int
) -> AbstractContextManager[Span | None]:
    """`_generation_span` where telemetry or DEBUG logs are on (`observing`); else a context
    that does nothing and gives None."""
    if not observing():
        return nullcontext(None)
    return _generation_span(provider, model, base_url, max_tokens)


@contextmanager
def _generation_span(
    provider: str, model: str | None, base_url: str | None, max_tokens: int
) -> Iterator[Span]:
    """The span of one schema-bound generation (CLIENT: ``chat {model}``), its duration, and
    its error counted if it fails."""
    common: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        **server_attributes(base_url),
    }
    if model:
        common["gen_ai.request.model"] = model
    attributes = {**common, "gen_ai.request.max_tokens": max_tokens, "gen_ai.output.type": "json"}

    def end(span: Span) -> None:
        recorders = instruments()
        recorders.operation_duration.record(span.elapsed(), span.attributes)
        if "error.type" in span.attributes:
            recorders.errors.add(1, {**span.attributes, "typevet.operation": "generate"})

    name = f"chat {model}" if model else "chat"
    with traced_span(name, _SpanKind.CLIENT, attributes, common, end) as span:
        yield span


def generated(span: Span, prompt_tokens: int, completion_tokens: int, finish_reason: str) -> None:
    span.set("gen_ai.usage.input_tokens", prompt_tokens)
    span.set("gen_ai.usage.output_tokens", completion_tokens)
    span.set("gen_ai.response.finish_reasons", (finish_reason,))
    recorders = instruments()
    recorders.token_usage.record(prompt_tokens, {**span.attributes, "gen_ai.token.type": "input"})
    recorders.token_usage.record(
        completion_tokens, {**span.attributes, "gen_ai.token.type": "output"}
    )
