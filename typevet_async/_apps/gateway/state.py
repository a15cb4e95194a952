"""The gateway's running state: admission (slots, and which requests are admitted and how long
a 429 says to wait, from the measured service times and the slots' holders), readiness, the
judgments in flight, and the Prometheus metrics."""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import heapq
import math
import time
from typing import Any, Final

import anyio
import attrs
from aiohttp import web

import typevet_async as tv
from typevet_async._apps.gateway.config import DEFAULT_AUTO_QUEUE, MAX_AUTO_QUEUE, GatewayConfig

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

#: Service times admission is measured over (the most recent judgments that did the work).
_SERVICE_WINDOW: Final = 64
#: The shortest wait a 429 advises (``retry-after-ms``): a retry sooner than this finds the
#: gateway as it left it (its own round trip and decode take a few ms), and a client that
#: honours the header tries at most 20 times a second.
RETRY_FLOOR: Final = 0.05
#: The longest wait a 429 advises: clients that read ``Retry-After`` commonly ignore more.
RETRY_CEILING: Final = 60.0
#: The share of a service time a judgment admitted is planned to end before its deadline by
#: (`_with_spare`).
_SPARE: Final = 0.25
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
                "typevet_gateway_requests",
                "Requests by route and status",
                ["route", "status"],
                registry=registry,
            ),
            latency=p.Histogram(
                "typevet_gateway_request_seconds",
                "Request latency by route",
                ["route"],
                registry=registry,
                buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            ),
            errors=p.Counter(
                "typevet_gateway_errors",
                "Failed judgments by error type",
                ["type"],
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
        )

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
    #: When each judgment holding a slot now took it (the gateway's clock): when the slots
    #: free, hence when a request admitted now would get one.
    holding: list[float] = attrs.Factory(list)
    #: The places promised to requests shed earlier (a heap of when, and how many judgments),
    #: and their judgments in all: each 429 promises the places it names, so requests shed
    #: together are told to come back one departure apart, not all at the same instant. A
    #: promise lapses when its time comes; none is made past `RETRY_CEILING`.
    promises: list[tuple[float, int]] = attrs.Factory(list)
    promised: int = 0

    def now(self) -> float:
        """The gateway's clock: monotonic seconds (read through the module, so a test can move
        it without moving the event loop's)."""
        return time.monotonic()

    def took_slot(self) -> float:
        """Record a judgment taking its slot now; when it took it (for `left_slot`)."""
        since = self.now()
        self.holding.append(since)
        return since

    def left_slot(self, since: float) -> None:
        """Record the judgment that took its slot at ``since`` leaving it."""
        with contextlib.suppress(ValueError):
            self.holding.remove(since)

    def held_since(self, since: float) -> None:
        """Record one judgment that did the work: it held its slot from ``since`` to now."""
        self.service_times.append(max(0.0, self.now() - since))

    def service_time(self) -> float | None:
        """How long a judgment is taken to hold its slot: the 90th percentile of the recent
        service times (None: no judgment has done the work yet). Not their mean: a request
        admitted at the edge of what a mean allows meets the deadline every other time, and
        those told to come back are at that edge by design."""
        return _slow(sorted(self.service_times))

    def most_admitted(self) -> int:
        """Judgments admitted at most, judged or waiting: the slots and the longest queue
        (``max_queue``; else `MAX_AUTO_QUEUE`, or `DEFAULT_AUTO_QUEUE` before anything is
        measured). Within it, the deadline decides (`places`)."""
        if self.config.max_queue is not None:
            queue = self.config.max_queue
        else:
            queue = MAX_AUTO_QUEUE if self.service_times else DEFAULT_AUTO_QUEUE
        return self.config.max_active_requests + queue

    def places(self) -> int:
        """Judgments that may be admitted now (a request of more is shed): within
        `most_admitted`, those that, behind the judgments already admitted, get a slot and
        are judged within ``request_deadline`` at the measured service times (`timely`). Those
        that find a free slot are always admitted, and so is any request to an idle gateway:
        waiting could not make them faster, and their times keep the measure current."""
        room = self.most_admitted() - self.admitted
        service, deadline = self.service_time(), self.config.request_deadline
        if service is None or deadline is None or self.admitted == 0:
            return room
        free = self.config.max_active_requests - self.admitted
        return min(room, max(free, self.timely(service, deadline) - self._waiting()))

    def timely(self, service: float, deadline: float) -> int:
        """Judgments that, given slots in turn from now (the first ones by those already
        waiting), would each be judged within ``deadline`` of now, each holding its slot
        ``service`` seconds: on each slot, those that start by ``deadline`` less the service
        time with its spare (`_with_spare`) from now."""
        now = self.now()
        last_start = now + deadline - _with_spare(service)
        frees = [free for free in self._frees(now, service) if free <= last_start]
        fitting = sum(math.floor((last_start - free) / service) + 1 for free in frees)
        return min(fitting, self.most_admitted())

    def retry_after(self, judgments: int = 1) -> float:
        """Seconds until a request of ``judgments`` judgments (a batch's states each count)
        shed now would be admitted, if those admitted leave as measured and those shed before
        it come back when told: when its last judgment would get its slot early enough to
        end by its deadline (or when all its judgments would find free slots), and when
        enough have left for `most_admitted`; between `RETRY_FLOOR` and `RETRY_CEILING`
        (`RETRY_UNMEASURED` before anything is measured). Each call promises those places."""
        service = self.service_time()
        if service is None:
            return RETRY_UNMEASURED
        now = self.now()
        while self.promises and self.promises[0][0] <= now:
            self.promised -= heapq.heappop(self.promises)[1]
        promised = self.promised
        frees = self._frees(now, service)
        slots = len(frees)

        def start(turn: int) -> float:
            """When the ``turn``-th judgment given a slot from now gets it (1: the first)."""
            if turn <= 0:
                return now
            rounds, slot = divmod(turn - 1, slots)
            return frees[slot] + rounds * service

        ahead = self._waiting() + promised
        # free slots are departures already made: the bound needs this many real ones more
        over = self.admitted + promised + judgments - self.most_admitted()
        at = start(slots - len(self.holding) + over) if over > 0 else now
        deadline = self.config.request_deadline
        if deadline is not None:
            in_time = start(ahead + judgments) + _with_spare(service) - deadline
            at = max(at, min(in_time, start(ahead + min(judgments, slots))))
        if at < now + RETRY_CEILING:
            heapq.heappush(self.promises, (at, judgments))
            self.promised += judgments
        return min(RETRY_CEILING, max(RETRY_FLOOR, at - now))

    def _waiting(self) -> int:
        """Judgments admitted that wait for a slot."""
        return max(0, self.admitted - len(self.holding))

    def _frees(self, now: float, service: float) -> list[float]:
        """When each slot frees, soonest first: a free slot now; a busy one when its judgment
        is taken to end: the 90th percentile of the recent service times longer than it has
        run (one ``service`` from now, past all of them)."""
        times = sorted(self.service_times)
        frees = []
        for since in self.holding:
            ran = now - since
            longer = _slow(times[bisect.bisect_right(times, ran) :])
            frees.append(now + (longer - ran if longer is not None else service))
        frees.extend([now] * (self.config.max_active_requests - len(frees)))
        return sorted(frees)


def _with_spare(service: float) -> float:
    """The time a judgment is planned to take against its deadline: its service time and a
    quarter more. Service times jitter, and a request told to come back arrives at the edge of
    what admission allows by design: planned to the edge, half of those would meet the 504."""
    return service * (1 + _SPARE)


def _slow(ordered: list[float]) -> float | None:
    """The 90th percentile (nearest rank) of service times in ascending order; None if none."""
    if not ordered:
        return None
    return max(ordered[math.ceil(0.9 * len(ordered)) - 1], 1e-6)


SESSION: Final = web.AppKey("session", tv.Session)
STATE: Final = web.AppKey("state", GatewayState)
