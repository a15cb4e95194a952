"""What the SDK reports of its work: OpenTelemetry spans and metrics, W3C trace context on every
request, and logs. One owner for every event (a judgment, a question, a read, a retry, an
escalation, an off-menu trip, a slot wait): each call here emits its span, metric and log
together, so the three never disagree.

OpenTelemetry is optional (the ``otel`` extra installs ``opentelemetry-api``; the SDK never
depends on ``opentelemetry-sdk``). With the API absent, or present with no provider installed
(the API's default), `active` is False and the pipelines take their plain path: one check per
judgment and per read, nothing built. The application installs a tracer and meter provider
(``opentelemetry-instrument``, or its own ``set_tracer_provider``) and the same calls then
record. The spans follow the OpenTelemetry GenAI semantic conventions where they apply
(``gen_ai.operation.name``, ``gen_ai.provider.name``, ``gen_ai.request.model``,
``gen_ai.usage.input_tokens``, ``gen_ai.usage.cache_read.input_tokens``; metrics
``gen_ai.client.operation.duration`` and ``gen_ai.client.token.usage``), plus the SDK's own
``typevet.*`` attributes.

Content: no attribute, event, status or log record carries state text, a prompt, a key or an
error's message (which may quote a server's reply) unless the caller opts in with the GenAI
conventions' own switch, ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`` (read
once, at import): error types, counts, sizes and ids only.

Logs: the ``typevet_async`` logger hierarchy (``typevet_async.judgment``, ``.question``,
``.read``, ``.retry``, ...), structured fields in ``extra`` (``question_id``, ``attempts``,
``status``, ``duration_ms``, ...): DEBUG for each judgment, question and HTTP read, WARNING
for each retry and escalation, and the same content rule.
"""

from typevet_async._telemetry.events import (
    cache_store_failed,
    escalated,
    off_menu_raised,
    quiet_retries,
    retried,
    slot_waited,
)
from typevet_async._telemetry.instruments import CAPTURE_CONTENT, active, observing
from typevet_async._telemetry.propagation import server_span, with_trace_context
from typevet_async._telemetry.spans import (
    Span,
    answered,
    generated,
    generation_span,
    judged,
    judgment_span,
    question_span,
    read_span,
    read_usage,
)

__all__ = [
    "CAPTURE_CONTENT",
    "Span",
    "active",
    "answered",
    "cache_store_failed",
    "escalated",
    "generated",
    "generation_span",
    "judged",
    "judgment_span",
    "observing",
    "off_menu_raised",
    "question_span",
    "quiet_retries",
    "read_span",
    "read_usage",
    "retried",
    "server_span",
    "slot_waited",
    "with_trace_context",
]
