"""The gateway's running state: admission (slots, and the queue and 429 waits sized from the
measured service times), readiness, the judgments in flight, and the Prometheus metrics."""

from __future__ import annotations

import asyncio
import collections
import math
import time
from typing import Any, Final

import anyio
import attrs
from aiohttp import web

import typevet_async as tv
from typevet_async._gateway.config import (
    DEFAULT_AUTO_QUEUE,
    MAX_AUTO_QUEUE,
    MIN_AUTO_QUEUE,
    GatewayConfig,
)

try:
    import prometheus_client
except ImportError:  # pragma: no cover - without the serve extra
    prometheus_client = None  # type: ignore[assignment]

__all__ = [
    "RETRY_CEILING",
    "RETRY_FLOOR",
    "RETRY_UNMEASURED",
    "SESSION",
    "STATE",
    "GatewayState",
    "Metrics",
]

#: Service times the capacity is measured over (the most recent judgments that did the work).
_SERVICE_WINDOW: Final = 64
#: The shortest wait a 429 advises (``retry-after-ms``): a retry sooner than this finds the
#: gateway as it left it (its own round trip and decode take a few ms), and a client that
#: honours the header tries at most 20 times a second.
RETRY_FLOOR: Final = 0.05
#: The longest wait a 429 advises: clients that read ``Retry-After`` commonly ignore more.
RETRY_CEILING: Final = 60.0
#: What a 429 advises before any service time is measured.
RETRY_UNMEASURED: Final = 1.0


@attrs.define
class Metrics:
    requests: Any
    latency: Any
    errors: Any
    reads: Any
    in_flight: Any
    batch_states: Any
    registry: Any

    @classmethod
    def create(cls) -> Metrics | None:
        if prometheus_client is None:  # pragma: no cover
            return None
        registry = prometheus_client.CollectorRegistry()
        p = prometheus_client
        return cls(
            requests=p.Counter(
                "typevet_gateway_requests", "Requests by route and status", ["route", "status"],
                registry=registry,
            ),
            latency=p.Histogram(
                "typevet_gateway_request_seconds", "Request latency by route", ["route"],
                registry=registry,
                buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            ),
            errors=p.Counter(
                "typevet_gateway_errors", "Failed judgments by error type", ["type"],
                registry=registry,
            ),
            reads=p.Counter(
                "typevet_gateway_upstream_reads", "Scoring reads sent upstream", registry=registry
            ),
            in_flight=p.Gauge(
                "typevet_gateway_in_flight", "Requests being judged", registry=registry
            ),
            batch_states=p.Counter(
                "typevet_gateway_batch_states", "States received in batches", registry=registry
            ),
            registry=registry,
        )  # fmt: skip

    def exposition(self) -> tuple[bytes, str]:
        """The metrics in Prometheus' text format, and its content type."""
        assert prometheus_client is not None  # a Metrics exists only with it
        return prometheus_client.generate_latest(
            self.registry
        ), prometheus_client.CONTENT_TYPE_LATEST


@attrs.define
class GatewayState:
    config: GatewayConfig
    slots: asyncio.Semaphore
    #: Bodies decoded at once (worker threads).
    decoders: anyio.CapacityLimiter
    metrics: Metrics | None
    #: Requests judged or waiting for a slot.
    admitted: int = 0
    ready: bool = False
    served_model: str | None = None
    ready_date: str | None = None
    probe_task: asyncio.Task[None] | None = None
    #: The handler tasks judging now (those the shutdown cuts off past its timeout).
    judging: set[asyncio.Task[Any]] = attrs.Factory(set)
    #: Set once the shutdown timeout passed: the judgments still running answer 503.
    cut_off: bool = False
    #: How long each of the most recent judgments that did the work held its slot (seconds):
    #: those answered, and those cut by a timeout, which held it all along. A fast failure (a
    #: refusal, an upstream 5xx) is not one: it says nothing of how long work takes.
    service_times: collections.deque[float] = attrs.Factory(
        lambda: collections.deque(maxlen=_SERVICE_WINDOW)
    )
    #: When the last place promised to a shed request should free (monotonic seconds): each
    #: 429 promises the next departures after it, so requests shed together are told to come
    #: back one departure apart, not all at the same instant.
    promised_until: float = 0.0

    def now(self) -> float:
        """The gateway's clock: monotonic seconds (read through the module, so a test can move
        it without moving the event loop's)."""
        return time.monotonic()

    def held_since(self, since: float) -> None:
        """Record one judgment that did the work: it held its slot from ``since`` to now."""
        self.service_times.append(max(0.0, self.now() - since))

    def service_time(self) -> float | None:
        """The mean of the recent service times (None: no judgment has done the work yet)."""
        if not self.service_times:
            return None
        return max(sum(self.service_times) / len(self.service_times), 1e-6)

    def capacity(self) -> float | None:
        """Judgments a second the slots serve while all are busy: ``max_active_requests`` over
        the mean service time (Little's law); None before any judgment did the work. It
        depends on no idle time and no fast failure."""
        mean = self.service_time()
        return None if mean is None else self.config.max_active_requests / mean

    def queue_limit(self) -> int:
        """Requests that may wait for a slot now: those that, at the measured capacity, get a
        slot and are judged within ``request_deadline`` (at least `MIN_AUTO_QUEUE`, at most
        `MAX_AUTO_QUEUE`; `DEFAULT_AUTO_QUEUE` before anything is measured)."""
        if self.config.max_queue is not None:
            return self.config.max_queue
        capacity, mean = self.capacity(), self.service_time()
        deadline = self.config.request_deadline
        if capacity is None or mean is None or deadline is None:
            return DEFAULT_AUTO_QUEUE
        # the last in line waits for that many departures, then is judged itself
        fits = math.floor(capacity * (deadline - mean))
        return min(MAX_AUTO_QUEUE, max(MIN_AUTO_QUEUE, fits))

    def retry_after(self, judgments: int = 1) -> float:
        """Seconds until a request of ``judgments`` judgments (a batch's states each count)
        shed now would be admitted: the departures it needs, at the measured capacity, after
        those promised to requests shed before it; between `RETRY_FLOOR` and `RETRY_CEILING`
        (`RETRY_UNMEASURED` before anything is measured). Each call promises those places."""
        capacity = self.capacity()
        if capacity is None:
            return RETRY_UNMEASURED
        now = self.now()
        limit = self.config.max_active_requests + self.queue_limit()
        needed = max(1, self.admitted + judgments - limit)
        free_at = max(now, self.promised_until) + needed / capacity
        self.promised_until = min(free_at, now + RETRY_CEILING)
        return min(RETRY_CEILING, max(RETRY_FLOOR, free_at - now))


SESSION: Final = web.AppKey("session", tv.Session)
STATE: Final = web.AppKey("state", GatewayState)
