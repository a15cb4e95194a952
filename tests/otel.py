"""The real OpenTelemetry SDK, installed as the process's providers for one test: its
in-memory span exporter and a delta-temporality in-memory metric reader.

OpenTelemetry's API lets a process set its providers once; between tests the globals are
reset the way OpenTelemetry's own test utilities do it (``opentelemetry.test.globals_test``),
through the API's module attributes: the SDK under test builds its instruments again for
the new providers (`typevet_async._telemetry._get`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import _internal as metrics_internal
from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    MeterProvider,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

_DELTA = dict.fromkeys(
    (Counter, UpDownCounter, Histogram, ObservableCounter, ObservableUpDownCounter,
     ObservableGauge),
    AggregationTemporality.DELTA,
)  # fmt: skip


class Recorded:
    """What the providers recorded: finished spans and metric points."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.reader = InMemoryMetricReader(preferred_temporality=_DELTA)
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [span for span in self.spans() if span.name.startswith(prefix)]

    def children(self, parent: ReadableSpan) -> list[ReadableSpan]:
        return [
            span
            for span in self.spans()
            if span.parent is not None and span.parent.span_id == parent.context.span_id
        ]

    def metrics(self) -> dict[str, list[Any]]:
        """Each metric's data points since the last call (delta temporality)."""
        points: dict[str, list[Any]] = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    points.setdefault(metric.name, []).extend(metric.data.data_points)
        return points


def total(points: Sequence[Any]) -> float:
    """A counter's points summed (sums) or a histogram's counts summed."""
    return sum(getattr(point, "value", None) or getattr(point, "count", 0) for point in points)


def everything_recorded(otel: Recorded, records: Sequence[logging.LogRecord]) -> str:
    """Every span's name, attributes, events and status, every metric point's attributes and
    every log record's message and fields, as one text (to search for what must not be
    there, a secret or caller text)."""
    parts: list[Any] = []
    for span in otel.spans():
        parts += [span.name, dict(span.attributes or {}), span.status.description]
        parts += [(event.name, dict(event.attributes or {})) for event in span.events]
    for points in otel.metrics().values():
        parts += [dict(point.attributes or {}) for point in points]
    for record in records:
        parts += [record.getMessage(), {k: v for k, v in vars(record).items() if k != "msg"}]
    return json.dumps(parts, default=str)


def _reset_globals() -> None:
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
    metrics_internal._METER_PROVIDER_SET_ONCE = Once()
    metrics_internal._METER_PROVIDER = None


@contextmanager
def installed() -> Iterator[Recorded]:
    """The SDK's providers installed globally for the block, then none again."""
    recorded = Recorded()
    _reset_globals()
    trace.set_tracer_provider(recorded.tracer_provider)
    metrics.set_meter_provider(recorded.meter_provider)
    try:
        yield recorded
    finally:
        recorded.tracer_provider.shutdown()
        recorded.meter_provider.shutdown()
        _reset_globals()
