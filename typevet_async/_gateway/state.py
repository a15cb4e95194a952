"""The gateway's running state: admission (slots, the queue and its drain rate), readiness,
the judgments in flight, and the Prometheus metrics."""

from __future__ import annotations

import asyncio
import collections
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

__all__ = ["SESSION", "STATE", "GatewayState", "Metrics"]

#: Judgments the drain rate is measured over (the most recent).
_DRAIN_WINDOW: Final = 64


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
    #: When the most recent judgments ended (monotonic seconds), for the drain rate.
    finished: collections.deque[float] = attrs.Factory(
        lambda: collections.deque(maxlen=_DRAIN_WINDOW)
    )

    def drain_rate(self) -> float | None:
        """Judgments ended per second over the recent window (None: too few to tell)."""
        if len(self.finished) < 2:
            return None
        span = max(time.monotonic(), self.finished[-1]) - self.finished[0]
        return (len(self.finished) - 1) / span if span > 0 else None

    def queue_limit(self) -> int:
        """Requests that may wait for a slot now."""
        if self.config.max_queue is not None:
            return self.config.max_queue
        rate = self.drain_rate()
        if rate is None or self.config.request_deadline is None:
            return DEFAULT_AUTO_QUEUE
        return int(min(MAX_AUTO_QUEUE, max(MIN_AUTO_QUEUE, rate * self.config.request_deadline)))

    def retry_after(self) -> float:
        """Seconds until a place in the queue is likely free, from the drain rate (1 s before
        anything is measured), between 1 and 60."""
        rate = self.drain_rate()
        if rate is None:
            return 1.0
        excess = self.admitted - (self.config.max_active_requests + self.queue_limit()) + 1
        return min(60.0, max(1.0, excess / rate))


SESSION: Final = web.AppKey("session", tv.Session)
STATE: Final = web.AppKey("state", GatewayState)
