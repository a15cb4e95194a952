"""W3C trace context across the wire: sent with every request made under a recording span,
and joined from an incoming request's headers (the gateway's server span)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from typevet_async._telemetry.instruments import OTEL, active
from typevet_async._telemetry.spans import Span, traced_span

if OTEL:
    from opentelemetry import context as _context
    from opentelemetry import propagate as _propagate
    from opentelemetry import trace as _trace
    from opentelemetry.trace import SpanKind as _SpanKind

__all__ = ["server_span", "with_trace_context"]


def with_trace_context(headers: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """``headers`` with the current span's W3C ``traceparent`` (and ``tracestate``, baggage:
    the global propagator's fields), when a span is recording; else ``headers`` as they are
    (one context lookup)."""
    if not active() or not _trace.get_current_span().is_recording():
        return headers
    carrier: dict[str, str] = dict(headers) if headers else {}
    _propagate.inject(carrier)
    return carrier


@contextmanager
def server_span(
    name: str, carrier: Mapping[str, str], attributes: dict[str, Any]
) -> Iterator[Span | None]:
    """A SERVER span joined to the trace context in ``carrier`` (an incoming request's
    headers, or MCP's ``_meta``), current for the block; None with telemetry off."""
    if not active():
        yield None
        return
    token = _context.attach(_propagate.extract(carrier))
    try:
        with traced_span(name, _SpanKind.SERVER, attributes, {}) as span:
            yield span
    finally:
        _context.detach(token)
