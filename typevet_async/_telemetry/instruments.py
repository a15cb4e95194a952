"""Whether telemetry is on, and the tracer and metric instruments of the installed providers
(none without the ``otel`` extra); the SDK's loggers and the content switch."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any, Final

from typevet_async._version import __version__

__all__ = [
    "CAPTURE_CONTENT",
    "OTEL",
    "Instruments",
    "active",
    "instruments",
    "judgment_log",
    "observing",
    "question_log",
    "read_log",
    "retry_log",
    "tracing",
]

#: The instrumentation scope's name, and the root of the SDK's loggers.
SCOPE: Final = "typevet_async"
#: The GenAI conventions' switch for recording message content (off unless "true").
CAPTURE_CONTENT: Final = (
    os.environ.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "").strip().lower()
    == "true"
)

judgment_log = logging.getLogger("typevet_async.judgment")
question_log = logging.getLogger("typevet_async.question")
read_log = logging.getLogger("typevet_async.read")
retry_log = logging.getLogger("typevet_async.retry")

try:
    from opentelemetry import metrics as _metrics
    from opentelemetry import trace as _trace
    from opentelemetry.metrics import NoOpMeterProvider as _NoOpMeterProvider
    from opentelemetry.metrics import _internal as _metrics_state
    from opentelemetry.trace import NoOpTracerProvider as _NoOpTracerProvider
    from opentelemetry.trace import ProxyTracerProvider as _ProxyTracerProvider

    try:  # the API's placeholder before a meter provider is set (private, hence guarded)
        from opentelemetry.metrics._internal import _ProxyMeterProvider
    except ImportError:  # pragma: no cover - a future API without it
        _ProxyMeterProvider = _NoOpMeterProvider  # type: ignore[assignment,misc]
    OTEL = True
except ImportError:  # the otel extra is not installed
    OTEL = False

#: Whether `active` may read the API's own provider globals (None until a provider is set):
#: two attribute reads on the hot path, where ``get_tracer_provider`` and
#: ``get_meter_provider`` also look up an environment variable each (about 1.9 µs the pair,
#: three times a question: measured by benchmarks/client_cost/bench_telemetry_cost.py). Not where a
#: provider is named by ``OTEL_PYTHON_TRACER_PROVIDER`` or ``..._METER_PROVIDER`` (the API
#: loads it at the first ``get_*_provider``), nor with an API that keeps them elsewhere.
_GLOBALS_READABLE: Final = (
    OTEL
    and hasattr(_trace, "_TRACER_PROVIDER")
    and hasattr(_metrics_state, "_METER_PROVIDER")
    and "OTEL_PYTHON_TRACER_PROVIDER" not in os.environ
    and "OTEL_PYTHON_METER_PROVIDER" not in os.environ
)


def active() -> bool:
    """A tracer or meter provider is installed: the SDK then records spans and metrics.

    Checked once per judgment and once per read, never cached (an application may install
    its provider after the session opened): with none installed, two attribute reads."""
    if not OTEL:
        return False
    if (
        _GLOBALS_READABLE
        and _trace._TRACER_PROVIDER is None
        and _metrics_state._METER_PROVIDER is None
    ):
        return False
    return not isinstance(
        _trace.get_tracer_provider(), _ProxyTracerProvider | _NoOpTracerProvider
    ) or not isinstance(_metrics.get_meter_provider(), _ProxyMeterProvider | _NoOpMeterProvider)


def tracing() -> bool:
    """A tracer provider is installed: spans are recorded."""
    return OTEL and not isinstance(
        _trace.get_tracer_provider(), _ProxyTracerProvider | _NoOpTracerProvider
    )


def observing() -> bool:
    """`active`, or the SDK's DEBUG log records wanted: the pipelines then time their reads
    and judgments (spans only where a tracer provider is installed)."""
    return (
        active()
        or judgment_log.isEnabledFor(logging.DEBUG)
        or question_log.isEnabledFor(logging.DEBUG)
        or read_log.isEnabledFor(logging.DEBUG)
    )


class _Nothing:
    """An instrument that records nothing: every instrument without OpenTelemetry."""

    def add(self, amount: float, attributes: Mapping[str, Any] | None = None) -> None:
        pass

    def record(self, amount: float, attributes: Mapping[str, Any] | None = None) -> None:
        pass


class Instruments:
    """The tracer and the metric instruments of one pair of providers (the installed ones)."""

    reads: Any
    retries: Any
    escalations: Any
    errors: Any
    off_menu: Any
    cache: Any
    cache_failures: Any

    def __init__(self, providers: tuple[Any, Any] = (None, None)) -> None:
        #: The tracer and meter providers they were built from.
        self.providers = providers
        self.tracer: Any = None
        if not OTEL:
            nothing: Any = _Nothing()
            self.operation_duration = self.token_usage = self.judgment_duration = nothing
            self.reads = self.retries = self.escalations = self.errors = nothing
            self.off_menu = self.in_flight = self.slot_wait = self.cache = nothing
            self.cache_failures = nothing
            return
        version = __version__
        tracer_provider, meter_provider = providers
        self.tracer = tracer_provider.get_tracer(SCOPE, version)
        meter = meter_provider.get_meter(SCOPE, version)
        self._durations(meter)
        self._counts(meter)

    def _durations(self, meter: Any) -> None:
        """The histograms: durations (seconds) and token usage."""
        seconds = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96]
        self.slot_wait = meter.create_histogram(
            "typevet.slot.wait",
            unit="s",
            description="Time a read waited for one of the session's slots (reads that waited)",
            explicit_bucket_boundaries_advisory=seconds,
        )
        self.operation_duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="Duration of a GenAI operation: one read or generation request",
            explicit_bucket_boundaries_advisory=seconds,
        )
        self.token_usage = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Tokens a read or generation used",
            explicit_bucket_boundaries_advisory=[
                1,
                4,
                16,
                64,
                256,
                1024,
                4096,
                16384,
                65536,
                262144,
                1048576,
            ],
        )
        self.judgment_duration = meter.create_histogram(
            "typevet.judgment.duration",
            unit="s",
            description="Duration of a judgment, every question's reads included",
            explicit_bucket_boundaries_advisory=seconds,
        )

    def _counts(self, meter: Any) -> None:
        """The counters (`_COUNTERS`), and the reads in flight."""
        for attribute, name, unit, description in _COUNTERS:
            setattr(self, attribute, meter.create_counter(name, unit=unit, description=description))
        self.in_flight = meter.create_up_down_counter(
            "typevet.reads.in_flight", unit="{read}", description="Reads in flight"
        )


#: Each counter: its `Instruments` attribute, name, unit and description.
_COUNTERS: Final = (
    ("reads", "typevet.reads", "{read}", "Scoring reads sent (escalations included)"),
    ("retries", "typevet.retries", "{retry}", "Retries of transient failures"),
    (
        "escalations",
        "typevet.escalations",
        "{escalation}",
        "Reads sent again with a larger top-K because a candidate was missing",
    ),
    ("errors", "typevet.errors", "{error}", "Failed judgments and generations"),
    (
        "off_menu",
        "typevet.off_menu.trips",
        "{answer}",
        "Answers whose off-menu mass passed the judgment's threshold",
    ),
    ("cache", "typevet.cache.lookups", "{lookup}", "Read-cache lookups, by outcome (hit or miss)"),
    (
        "cache_failures",
        "typevet.cache.store_failures",
        "{read}",
        "Reads the read cache failed to store (a locked or full file, a store's own error)",
    ),
)


_instruments: Instruments | None = None


def instruments() -> Instruments:
    """The instruments of the installed providers, built again when an application installs
    others (tests do; the API's proxies would keep the first ones)."""
    global _instruments
    if not OTEL:
        if _instruments is None:
            _instruments = Instruments()
        return _instruments
    providers = (_trace.get_tracer_provider(), _metrics.get_meter_provider())
    if _instruments is None or _instruments.providers != providers:
        _instruments = Instruments(providers)
    return _instruments
